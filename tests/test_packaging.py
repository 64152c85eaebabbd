"""One import root: an editable install and a built wheel both give `policyzoo` and every one of its
packages (each is imported), and nothing installs as a bare `core`/`plugins`/`zoo`."""

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: every package pyproject.toml ships (tests/test_layout.py keeps the list equal to the tree)
PACKAGES = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
PROBE = (
    f"import importlib, importlib.util; [importlib.import_module(m) for m in {PACKAGES!r}];"
    "import policyzoo; print(policyzoo.__file__);"
    "print(all(importlib.util.find_spec(m) is None for m in ('core', 'plugins', 'zoo')))"
)


def _probe(cwd, env_path=None):
    env = {"PATH": "/usr/bin:/bin", "POLICYZOO_DISABLE_PLUGIN_AUTOLOAD": "1"}
    if env_path:
        env["PYTHONPATH"] = str(env_path)
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_editable_install_imports_single_root(tmp_path):
    # run from an unrelated folder so the repo root is not on sys.path
    location, no_bare = _probe(tmp_path)
    assert no_bare == "True"
    assert Path(location).resolve() == ROOT / "core" / "__init__.py"


def test_built_wheel_has_only_policyzoo(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(ROOT)], check=True, capture_output=True)
    wheel = next((tmp_path / "dist").glob("policyzoo-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"policyzoo"}
    assert "policyzoo/plugins/clip/__init__.py" in names and "policyzoo/zoo/grpo.py" in names
    assert "policyzoo/plugins/baseline/group.py" in names  # a slot package ships whole
    assert {f"{p.replace('.', '/')}/__init__.py" for p in PACKAGES} <= set(names)  # every sub-package
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                    str(wheel)], check=True, capture_output=True)
    location, no_bare = _probe(tmp_path, target)
    assert no_bare == "True"
    assert Path(location).resolve() == (target / "policyzoo" / "__init__.py").resolve()
