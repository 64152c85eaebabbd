"""Helpers of the sandbox tests: an ordinary user's view of the sandbox package."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

NON_ROOT_UID = 45678


def as_user_package(tmp: Path) -> Path:
    """The sandbox modules as a package that the system Python of an ordinary user can import
    (policyzoo's errors and the sandbox package, linked: they import nothing else)."""
    pkg = tmp / "pkg" / "policyzoo"
    (pkg / "plugins" / "env").mkdir(parents=True)
    for init in (pkg, pkg / "plugins", pkg / "plugins" / "env"):
        (init / "__init__.py").write_text("")
    os.symlink(ROOT / "core" / "errors.py", pkg / "errors.py")
    os.symlink(ROOT / "plugins" / "env" / "sandbox", pkg / "plugins" / "env" / "sandbox")
    return tmp / "pkg"
