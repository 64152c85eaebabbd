"""At ZeRO 0 in one process the trainer clips the gradients itself, from the per-parameter norms
it takes anyway for ``grad_norm`` (``policyzoo.engine.trainer.clipping``): no all-reduce over a group
of one, no second norm pass, and the same weights, bit for bit, as DeepSpeed's own clipping --
with a clip that bites (max norm 1e-3) and one that does not (1e6). Runs in a subprocess
(DeepSpeed initialises torch.distributed for the process)."""

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
import deepspeed.comm
import torch.distributed
import policyzoo.engine.trainer.clipping as clipping
from policyzoo.engine.models import resolve_model
from policyzoo.engine.trainer.deepspeed_trainer import Trainer
from policyzoo.config_sections import EngineSettings, ModelSettings, TrainSettings

info = resolve_model(sys.argv[1])
keep = clipping.clips_itself
calls = []
for mod in (deepspeed.comm, torch.distributed):
    inner = mod.all_reduce
    mod.all_reduce = (lambda inner: lambda *a, **k: (calls.append(1), inner(*a, **k))[1])(inner)
x = torch.tensor([[1, 40, 41, 42, 43, 60, 61, 62], [1, 50, 51, 70, 71, 72, 73, 74]])
out = {}
for clip in (1e-3, 1e6):
    for ours in (False, True):
        clipping.clips_itself = keep if ours else (lambda engine, world: False)
        tr = Trainer(info, ModelSettings(), TrainSettings(lr=1e-2, weight_decay=0.1, grad_clip=clip),
                     EngineSettings(zero_stage=0, critic_lr=1e-3),
                     need_ref=False, need_critic=False)
        norms, n_calls = [], 0
        for step in range(2):
            for row in range(2):  # two micro-batches accumulated per optimizer step
                logits = tr.engine(input_ids=x[row:row + 1]).logits[0, :-1].float()
                tr.backward(-logits.log_softmax(-1).gather(-1, x[row, 1:, None]).mean() * (step + 1))
            before = len(calls)
            norms.append(tr.step()["grad_norm"])
            n_calls += len(calls) - before
        w = {n: p.detach().flatten().tolist() for n, p in tr.engine.module.named_parameters()}
        out[f"{clip}-{ours}"] = {"weights": w, "norms": norms, "all_reduce": n_calls}
        tr.engine.destroy()
print("@@" + json.dumps(out))
'''


def test_zero_0_one_process_clips_like_deepspeed_without_its_all_reduce():
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_model())], env=engine_env(), capture_output=True,
                       text=True, timeout=600)
    lines = [x for x in r.stdout.splitlines() if x.startswith("@@")]
    assert r.returncode == 0 and lines, r.stderr[-3000:]
    got = json.loads(lines[-1][2:])
    for clip in ("0.001", "1000000.0"):
        ds, ours = got[f"{clip}-False"], got[f"{clip}-True"]
        # DeepSpeed's clip_grad_norm_ all-reduces the norm once per optimizer step (2 steps); ours never
        assert ds["all_reduce"] >= 2 and ours["all_reduce"] == 0, (ds["all_reduce"], ours["all_reduce"])
        assert ours["norms"] == ds["norms"] and ours["weights"] == ds["weights"]
    # the 1e-3 clip bites (gradient norms of a language-model loss are far above 1e-3), so the
    # two clips train differently: the comparison above covered both branches
    assert got["0.001-True"]["norms"][0] > 1e-2
    assert got["0.001-True"]["weights"] != got["1000000.0-True"]["weights"]
