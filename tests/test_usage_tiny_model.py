"""docs/usage.md's tiny-model recipe for smoke runs, run as written: its build command, then its train command under
``--dry-run`` (every check before weights load: the model folder, its tokenizer and chat template, the data)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

from _engine_helpers import ROOT, engine_env


def test_usage_tiny_model_recipe_runs(tmp_path):
    text = " ".join((ROOT / "docs" / "usage.md").read_text().split())
    build = re.search(r'`(python -c "from policyzoo\.testing\.tiny import build_tiny_model;[^`]*)`', text).group(1)
    train = re.search(r"`(policyzoo train --algo grpo model\.path=runs/tiny[^`]*)`", text).group(1)
    env = engine_env()
    args = shlex.split(build)
    subprocess.run([sys.executable, *args[1:]], cwd=tmp_path, env=env, check=True, timeout=300)
    # 2 layers x hidden 128, tied embeddings, 259 tokens (256 bytes + 3 specials), as the page says
    cfg = (tmp_path / "runs" / "tiny" / "config.json").read_text()
    assert '"num_hidden_layers": 2' in cfg and '"hidden_size": 128' in cfg and '"vocab_size": 259' in cfg
    args = shlex.split(train)
    proc = subprocess.run([sys.executable, "-m", "policyzoo.cli", *args[1:], "--dry-run"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "dry run: every check before loading weights passed" in proc.stderr
