"""The contrib distributions as a third party ships them: each is installed with pip (not
editable: ``pip install ./contrib/NAME``), is discovered through the ``policyzoo`` entry-point
group, matches its source tree (a stale install would test old code), builds a wheel holding only
its own package, and its own test suite passes against the installed copy."""

import importlib.metadata as md
import json
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DISTS = sorted(p.name for p in (ROOT / "contrib").iterdir() if (p / "pyproject.toml").exists())
INSTALL = "pip install " + " ".join(f"./contrib/{d}" for d in DISTS)


def _package(dist: str) -> str:
    return dist.replace("-", "_")


def test_there_are_at_least_two_distributions_each_with_readme_and_tests():
    assert len(DISTS) >= 2
    for d in DISTS:
        readme = (ROOT / "contrib" / d / "README.md").read_text()
        assert "arXiv" in readme and "```yaml" in readme and "## What it adds" in readme, d
        assert list((ROOT / "contrib" / d / "tests").glob("test_*.py")), d


@pytest.mark.parametrize("dist", DISTS)
def test_installed_with_pip_and_registered_through_the_entry_point_group(dist):
    try:
        meta = md.distribution(dist)
    except md.PackageNotFoundError:
        pytest.fail(f"{dist} is not installed: {INSTALL}")
    eps = [ep for ep in meta.entry_points if ep.group == "policyzoo"]
    assert [ep.value for ep in eps] == [_package(dist)]
    direct = json.loads(meta.read_text("direct_url.json") or "{}")
    assert not direct.get("dir_info", {}).get("editable"), \
        f"{dist} is installed editable; a third party gets a normal install: {INSTALL}"


@pytest.mark.parametrize("dist", DISTS)
def test_installed_copy_matches_the_source_tree(dist):
    pkg = __import__(_package(dist))
    installed = Path(pkg.__file__).parent
    source = ROOT / "contrib" / dist / "src" / _package(dist)
    assert installed != source, f"{dist} imports from the source tree, not from the installed copy"
    for f in source.glob("*.py"):
        assert (installed / f.name).read_text() == f.read_text(), f"stale install of {dist}: {INSTALL}"


@pytest.mark.parametrize("dist", DISTS)
def test_wheel_holds_only_its_own_package(dist, tmp_path):
    # built from a copy: a build in the source tree writes and deletes build/ and *.egg-info there, under
    # the feet of tests that read contrib/ meanwhile on the other pytest worker
    source = shutil.copytree(ROOT / "contrib" / dist, tmp_path / "src",
                             ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "wheels"), str(source)], check=True, capture_output=True, timeout=900)
    (wheel,) = (tmp_path / "wheels").glob("*.whl")
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    version = tomllib.loads((ROOT / "contrib" / dist / "pyproject.toml").read_text())["project"]["version"]
    assert tops == {_package(dist), f"{_package(dist)}-{version}.dist-info"}


def test_their_own_test_suites_pass_against_the_installed_copies():
    suites = [str(ROOT / "contrib" / d / "tests") for d in DISTS]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *suites],
                          cwd=ROOT / "contrib", capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
