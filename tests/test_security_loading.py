"""Nothing from a user's folder runs as code unless asked.

* A model folder whose ``config.json`` names custom code (``auto_map``) is refused without
  ``model.trust_remote_code``; the module (which would write a marker file) is never imported.
  With the switch set, transformers does import it: the marker appears (so the test can fail).
* A checkpoint file that unpickles into a function call is refused on ``--resume`` and the call
  never happens (every checkpoint file is read with ``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _engine_helpers import ROOT, engine_env, tiny_model, train_cmd

from policyzoo.engine.models import ModelError, resolve_model

EVIL = '''
from pathlib import Path
Path({marker!r}).write_text("custom code ran")
from transformers import LlamaConfig


class EvilConfig(LlamaConfig):
    pass
'''


def _remote_code_folder(tmp_path: Path) -> tuple[Path, Path]:
    folder, marker = tmp_path / "model", tmp_path / "marker.txt"
    shutil.copytree(tiny_model(), folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "evil_config.EvilConfig"}
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "evil_config.py").write_text(EVIL.format(marker=str(marker)))
    return folder, marker


def test_custom_code_in_a_model_folder_is_not_run_without_trust_remote_code(tmp_path):
    folder, marker = _remote_code_folder(tmp_path)
    with pytest.raises(ModelError, match="trust_remote_code"):
        resolve_model(str(folder))
    assert not marker.exists()
    # the same refusal through the CLI: one clear error, exit 2, no model loaded
    r = subprocess.run(train_cmd(tmp_path / "run", "train.steps=1", model=folder), env=engine_env(),
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 2 and "trust_remote_code" in r.stderr and "Traceback" not in r.stderr
    assert not marker.exists()
    # with the switch on, transformers imports the folder's module (the marker proves it would run)
    resolve_model(str(folder), trust_remote_code=True)
    assert marker.read_text() == "custom code ran"


class _Touch:
    """Unpickles into ``Path(marker).touch()``: what a malicious checkpoint could do."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path(self.marker).touch, ())


def test_resume_refuses_a_checkpoint_that_would_run_code(tmp_path):
    out, marker = tmp_path / "run", tmp_path / "pwned"
    r = subprocess.run(train_cmd(out, "train.steps=1", "engine.rollout=transformers", "engine.threads=1"),
                       env=engine_env(), capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    states = next((out / "checkpoints" / "step-000001" / "policy").glob("*model_states.pt"))
    sd = torch.load(states, weights_only=True)
    sd["client_state_extra"] = _Touch(str(marker))
    torch.save(sd, states)
    r = subprocess.run([sys.executable, "-m", "policyzoo.cli", "train", "--resume", str(out), "train.steps=2"],
                       env=engine_env(), capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert r.returncode == 2, r.stderr[-3000:]
    err = " ".join(r.stderr.split())
    assert "model_states.pt" in err and "it was not loaded (loading it could run code)" in err
    assert "Traceback" not in r.stderr
    assert not marker.exists()
