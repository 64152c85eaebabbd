"""The escape suite: tests/ on the import path (the shared engine helpers live there) and
``user_dir``, a folder an ordinary user can reach."""

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _engine_helpers import BUILD  # noqa: E402 (needs the path above)


@pytest.fixture()
def user_dir():
    """A folder an ordinary user can reach (pytest's tmp_path is root's own, mode 0700)."""
    d = BUILD / f"user-{secrets.token_hex(4)}"
    d.mkdir(parents=True)
    os.chmod(d, 0o755)
    yield d
    subprocess.run(["rm", "-rf", str(d)], check=False)
