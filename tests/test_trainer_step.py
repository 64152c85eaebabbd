"""The trainer's optimizer step on a real DeepSpeed engine (tiny model, ZeRO 0, one process):
fused AdamW's first update, the reported gradient norm, and a NaN gradient skipping the update.
Runs in a subprocess (DeepSpeed initialises torch.distributed for the process)."""

from __future__ import annotations

import json
import subprocess
import sys

from _engine_helpers import engine_env, tiny_model

SCRIPT = r'''
import json, sys
from policyzoo.engine.process import setup_process
setup_process(1, 0.1)
import torch
from policyzoo.engine.models import resolve_model
from policyzoo.engine.trainer.deepspeed_trainer import Trainer
from policyzoo.config_sections import EngineSettings, ModelSettings, TrainSettings
tr = Trainer(resolve_model(sys.argv[1]), ModelSettings(), TrainSettings(lr=1e-3, weight_decay=0.0, grad_clip=1e6),
             EngineSettings(zero_stage=0, critic_lr=1e-3),
             need_ref=False, need_critic=False)
params = dict(tr.engine.module.named_parameters())
p = params["model.norm.weight"]
before = {n: q.detach().clone() for n, q in params.items()}
tr.backward(3.0 * p.sum())
out1 = tr.step()
moved = [n for n, q in params.items() if not torch.equal(q, before[n])]
after1 = p.detach().clone()
tr.backward(p.sum())
p.grad[0] = float("nan")  # a finite loss whose gradient is not finite
out2 = tr.step()
opt = tr.engine.optimizer
print("@@" + json.dumps({"out1": out1, "out2": out2, "moved": moved, "before": before["model.norm.weight"].tolist(),
      "after1": after1.tolist(), "unchanged2": torch.equal(p.detach(), after1), "fused": opt.defaults.get("fused"),
      "adam_steps": float(opt.state[p]["step"])}))
'''


def test_fused_adamw_first_step_norm_and_nan_gradient_skip():
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_model())], env=engine_env(), capture_output=True,
                       text=True, timeout=900)
    lines = [x for x in r.stdout.splitlines() if x.startswith("@@")]
    assert r.returncode == 0 and lines, r.stderr[-3000:]
    got = json.loads(lines[-1][2:])
    assert got["fused"] is True
    # loss = 3 * sum(w) over the final norm's 128 weights: gradient 3 on each, none elsewhere.
    # Norm before clipping: sqrt(128 * 3^2) = 3 * 11.3137 = 33.9411.
    assert got["out1"] == {"skipped": 0, "grad_norm": got["out1"]["grad_norm"]}
    assert abs(got["out1"]["grad_norm"] - 33.941125) < 1e-4
    # AdamW's first step: m_hat = g, v_hat = g^2, update = lr * g / (|g| + 1e-8) = 1e-3 (weight
    # decay 0), so each weight moves from its initial value by -0.001 and nothing else moves.
    assert got["moved"] == ["model.norm.weight"]
    assert all(abs(a - (b - 1e-3)) < 1e-6 for a, b in zip(got["after1"], got["before"]))
    # The NaN gradient skips the update: weights and optimizer state (step count 1) untouched.
    assert got["out2"] == {"skipped": 1} and got["unchanged2"] is True and got["adam_steps"] == 1.0
