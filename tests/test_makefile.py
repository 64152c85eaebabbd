"""The Makefile's set-up as ``make -n`` prints it: the CUDA path has no blank to fill (the vLLM wheel and the
torch it pins come from requirements/engine-cuda.txt), and the CPU path has no command whose failure make ignores."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def dry_run(tmp_path: Path, *args: str) -> str:
    # VENV in a fresh folder: no stamp, so make prints the whole set-up
    r = subprocess.run(["make", "-n", f"VENV={tmp_path / 'venv'}", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_setup_cuda_installs_the_pinned_pair(tmp_path):
    out = dry_run(tmp_path, "setup-cuda")
    # vLLM 0.32.0's wheel requires torch==2.13.0 (its metadata's Requires-Dist): the file pins both
    reqs = (ROOT / "requirements/engine-cuda.txt").read_text().splitlines()
    assert "vllm==0.32.0" in reqs and "torch==2.13.0" in reqs
    assert re.search(r"pip install -q torch==2\.13\.0\s*$", out, re.M)  # PyPI's default (CUDA) build, no index
    assert "pip install -q -r requirements/engine-cuda.txt" in out
    assert "uninstall" not in out  # torchvision stays on the CUDA path
    assert "<" not in "".join(line for line in out.splitlines() if "pip install" in line)
    assert str(tmp_path / "venv" / ".policyzoo-installed-cuda") in out


def test_cpu_setup_ignores_no_failure(tmp_path):
    out = dry_run(tmp_path, "setup")
    assert "pip install -q -r requirements/engine-cpu.txt" in out
    # make prints an ignored command's failure as "Error 1 (ignored)": the recipe has no '-' command left
    recipe = (ROOT / "Makefile").read_text().split("\n$(STAMP):", 1)[1].split("\n\n", 1)[0]
    assert not [line for line in recipe.splitlines() if line.startswith("\t-")]
    # only what is installed is uninstalled; compileall leaves out the files named for a newer Python
    assert "pip show -q $p" in out and "-x 'py3(1[2-9]|[2-9][0-9])_[a-z_]*\\.py$'" in out


def test_docs_give_the_gpu_setup_without_a_blank():
    for doc in ("README.md", "docs/distributed.md"):
        text = (ROOT / doc).read_text()
        assert "make setup-cuda" in text and "<the torch" not in text, doc
