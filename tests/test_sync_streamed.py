"""The streamed weight sync (one parameter gathered at a time) pushes exactly what the whole-model
sync pushes, at ZeRO 0 and ZeRO 3 on 2 CPU ranks (torchrun, gloo), and at ZeRO 3 holds one gathered
parameter at a time where the whole-model sync holds all of them (tests/_sync_probe.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from _engine_helpers import ROOT, engine_env, tiny_model

pytestmark = pytest.mark.engine_group  # 2 ranks, each holding vLLM and a DeepSpeed engine: make test-engine


@pytest.mark.parametrize("stage", [0, 3])
def test_streamed_sync_equals_the_whole_model_sync_on_two_ranks(stage):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
           str(ROOT / "tests" / "_sync_probe.py"), str(stage), str(tiny_model())]
    env = engine_env()
    env.pop("RANK", None)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-1000:] + r.stderr[-3000:]
    out = json.loads(next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))[7:])
    whole, streamed = out["whole"], out["streamed"]
    # the tiny Llama: embedding + 2 layers x 9 tensors (q k v o gate up down, 2 norms) + final norm = 20
    # (lm_head tied to the embedding: one parameter)
    assert out["params"] == 20
    assert streamed["names"] == whole["names"] and len(whole["names"]) == 20  # one agreed order, every weight
    assert out["weights_equal"] and out["ranks_agree"]
    assert out["moved"] > 1e-3  # one AdamW step at lr 1e-2 moved the weights: the push is not the file's
    # the copies score the sequence as the trainer does (fp32, same kernels: rounding only)
    assert whole["lp_diff"] < 1e-5 and streamed["lp_diff"] < 1e-5
    if stage == 3:
        assert whole["most_gathered"] == 20 and streamed["most_gathered"] == 1
    else:  # nothing is partitioned: every parameter is whole all the time
        assert whole["most_gathered"] == streamed["most_gathered"] == 20


def test_zero3_models_load_sharded_and_the_reference_scores_as_the_replica():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
           str(ROOT / "tests" / "_zero3_probe.py"), str(tiny_model())]
    env = engine_env()
    env.pop("RANK", None)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-1000:] + r.stderr[-3000:]
    out = json.loads(next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))[7:])
    # each of 2 ranks holds a half partition of the policy and of the reference (DeepSpeed pads each
    # partition to the rank count: at most 1 element per parameter over half). Parameters under DeepSpeed's
    # persistence threshold (1e5 elements: every tensor of the tiny model) also stay whole after a forward.
    assert 0.5 <= out["policy_held"] < 0.501 and 0.5 <= out["ref_held"] < 0.501
    assert out["trainable"] == out["replica_params"]  # counted from the partitioned parameters
    assert out["zero3_after"] is False  # zero.Init loading ended with the trainer's models
    # same weights, same kernels (fp32): the sharded reference and policy score as the whole replica
    assert out["ref_diff"] < 1e-5 and out["policy_diff"] < 1e-5
