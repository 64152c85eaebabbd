"""Colocated tensor-parallel rollout on 2 CPU ranks (torchrun, gloo): one vLLM engine sharded 2 ways
(``engine.vllm_tensor_parallel_size=2``, vLLM ``external_launcher``) against the same run with one
vLLM engine per rank (TP = 1). Two steps of GRPO on the tiny Llama, sync check on (fp32, 1e-4 nats).

What must be equal, and is asserted exactly: the steps, the rows trained per step (2 prompts x 8
samples), the prompts each step drew (data shares do not depend on TP). What must hold on the TP
run: the sync check passes after every push (each shard took its slice of the pushed weights: a
shard left with old weights moves the log-probs by > 1e-2), and each rank's shard holds half the
sharded weights. What may differ by vLLM's batch variance: the sampled tokens (a 2-way sharded
matmul sums in another order; a token flips only where two tokens tie to fp32 precision, and each
sample has its own seed, so a flip stays in its sample): at least 7 of the 8 logged
completions per step are asserted equal (observed: all, and equal gradient norms).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from _engine_helpers import ROOT, engine_env, metrics, train_cmd

pytestmark = pytest.mark.engine_group


def _train_on_two_ranks(out, *extra: str) -> str:
    cmd = train_cmd(out, "train.steps=2", "engine.zero_stage=2", *extra)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
           *cmd[1:]]
    env = engine_env()
    env.pop("RANK", None)
    # a session of its own: a hung run is killed with its rank processes, not just the launcher
    p = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise
    assert p.returncode == 0, stderr[-4000:]
    return stdout + stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("tp")
    tp2 = _train_on_two_ranks(base / "tp2", "engine.vllm_tensor_parallel_size=2")
    _train_on_two_ranks(base / "tp1")
    return base / "tp1", base / "tp2", tp2


def _completions(run_dir, step: int) -> list[dict]:
    rows = [json.loads(x) for x in (run_dir / "completions.jsonl").read_text().splitlines()]
    return [r for r in rows if r["step"] == step]


def test_one_engine_sharded_over_two_ranks_trains_the_same_batches(runs):
    tp1, tp2, console = runs
    # the tiny Llama's parameters in vLLM, per rank at TP 2: vocabulary 259 padded to 320 (a multiple
    # of 64) x hidden 128 split 2 ways = 20_480 (the LM head is tied to it); per layer, fused q/k/v
    # (128 + 64 + 64 rows) x 128 / 2 = 16_384, o 128 x 128 / 2 = 8_192, gate/up 512 x 128 / 2 = 32_768,
    # down 128 x 256 / 2 = 16_384, two norms 256 (replicated): 73_984; 2 layers + the final norm 128:
    # 20_480 + 147_968 + 128 = 168_576 (one whole engine: 336_512)
    assert "this rank's shard holds 168,576 parameters" in console
    m1, m2 = metrics(tp1), metrics(tp2)
    assert [r["step"] for r in m2] == [r["step"] for r in m1] == [1, 2]
    assert [r["rows"] for r in m2] == [r["rows"] for r in m1] == [16, 16]
    assert all(r["sync_max_diff"] <= 1e-4 for r in m2)
    for step in (1, 2):
        a, b = _completions(tp1, step), _completions(tp2, step)
        assert [r["prompt"] for r in b] == [r["prompt"] for r in a] and len(a) > 0
        same = sum(x["completion"] == y["completion"] for x, y in zip(a, b))
        assert same >= len(a) - 1, f"step {step}: {same} of {len(a)} completions equal"
    evals = [r for r in metrics(tp2, "eval")]
    assert [r["step"] for r in evals] == [0, 2]  # rank 0's group evaluated together, twice
