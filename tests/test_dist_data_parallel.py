"""Data parallel training: 2 CPU ranks (torchrun, gloo) give the update of 1 rank on the whole batch.

The rollout is the transformers fallback (``engine.rollout=transformers``): it samples each
prompt in its own ``generate`` call seeded from the prompt's global index, so the samples are
bit-identical whatever the number of ranks (vLLM batches prompts together and its CPU kernels
may round differently for other batch shapes), and it starts in ~1 s instead of ~10 s per rank.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _engine_helpers import ROOT, engine_env, metrics, tiny_model, train_cmd
from safetensors.torch import load_file

pytestmark = pytest.mark.engine_group  # several ranks, each a DeepSpeed engine: make test-engine

DP_SETTINGS = ["train.steps=2", "engine.rollout=transformers", "engine.threads=1"]


def completions(out) -> list[dict]:
    return [json.loads(x) for x in (out / "completions.jsonl").read_text().splitlines()]


def _train(out, nproc: int, *extra: str) -> None:
    cmd = train_cmd(out, *DP_SETTINGS, *extra)
    # python -m policyzoo.cli ... -> python -m torch.distributed.run --nproc_per_node N -m policyzoo.cli ...
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
               "--standalone", *cmd[1:]]
    env = engine_env()
    env.pop("RANK", None)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    out = tmp_path_factory.mktemp("dp") / "one"
    _train(out, 1, "engine.zero_stage=2")
    return out


# ZeRO 3 with a token budget: each rank's 8 rows cost 244 or 245 prompt + 12 response tokens, so
# 600 tokens hold 2 rows: 4 micro-batches per rank, each rank's gradients exact
# ZeRO 0: DeepSpeed averages the gradients inside step(); grad_norm must still be the global norm
@pytest.mark.parametrize("stage, extra", [(0, []), (2, []), (3, []), (3, ["train.max_tokens_per_micro_batch=600"])],
                         ids=["zero0", "zero2", "zero3", "zero3-token-budget"])
def test_two_ranks_equal_one_rank_on_the_whole_batch(tmp_path, one_rank, stage, extra):
    out = tmp_path / f"two-z{stage}"
    _train(out, 2, f"engine.zero_stage={stage}", *extra)
    base = load_file(tiny_model() / "model.safetensors")
    a = load_file(one_rank / "final" / "model.safetensors")
    b = load_file(out / "final" / "model.safetensors")
    # Two AdamW steps at lr 1e-3 move the weights by up to ~2e-3 (|update| <= lr per step);
    # fp32 rounding of the split sums leaves differences ~1e-6 (observed 2.5e-6 at ZeRO 2,
    # 3.8e-6 at ZeRO 3): the tolerance is 200x below the movement.
    assert max(float((a[k] - base[k]).abs().max()) for k in a) > 1e-3
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=1e-5, rtol=0)
    # AdamW hides a constant gradient factor, the gradient norm does not: a per-rank normaliser
    # or an unscaled DeepSpeed average (mean over 2 ranks) would each halve or double it.
    m1, m2 = metrics(one_rank), metrics(out)
    assert [r["step"] for r in m2] == [1, 2] and [r["rows"] for r in m2] == [r["rows"] for r in m1]
    for r1, r2 in zip(m1, m2):
        assert r2["grad_norm"] == pytest.approx(r1["grad_norm"], rel=1e-5)
        assert r2["reward_mean"] == pytest.approx(r1["reward_mean"], rel=1e-6)
        assert r2["loss"] == pytest.approx(r1["loss"], abs=1e-6)
    assert json.loads((out / "plugins.json").read_text())[0]["distribution"] == "policyzoo"
    assert [r["micro_batches"] for r in m2] == ([4, 4] if extra else [1, 1])
    # completions.jsonl holds every rank's rows: steps 1 and 2 (first and last) x 2 prompts x 8 samples,
    # the same rows as one rank's run (rank 0 holds prompt 0's group, rank 1 prompt 1's)
    c1, c2 = completions(one_rank), completions(out)
    assert len(c1) == len(c2) == 2 * 2 * 8
    assert sorted(c["rank"] for c in c2) == [0] * 16 + [1] * 16

    def key(c):
        return c["step"], c["prompt"], c["completion"], round(c["reward"], 6)
    assert sorted(map(key, c2)) == sorted(map(key, c1))


def test_a_zero_0_checkpoint_of_one_rank_continues_on_two(tmp_path):
    # ZeRO 0 keeps the whole optimizer state with the weights (no per-rank partition), so the
    # resume check lets another number of ranks load it; the run goes on as one rank would
    full, cut = tmp_path / "full", tmp_path / "cut"
    _train(full, 1, "engine.zero_stage=0", "train.steps=3")
    _train(cut, 1, "engine.zero_stage=0")  # 2 steps
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
           "-m", "policyzoo.cli", "train", "--resume", str(cut), "train.steps=3"]
    env = engine_env()
    env.pop("RANK", None)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = load_file(full / "final" / "model.safetensors"), load_file(cut / "final" / "model.safetensors")
    for k in a:  # fp32 rounding of the split sums, as above
        torch.testing.assert_close(b[k], a[k], atol=1e-5, rtol=0)
    assert [r["step"] for r in metrics(cut)] == [1, 2, 3]
    assert metrics(cut)[2]["loss"] == pytest.approx(metrics(full)[2]["loss"], abs=1e-6)


def test_reinforce_pp_with_one_prompt_per_rank_trains_as_one_rank(tmp_path):
    # reinforce_pp samples G = 1: with P = 2 prompts on 2 ranks each rank holds one response. Whitening
    # a single response's constant return gave A = 0 and a zero gradient on every rank; through the
    # collective both ranks whiten over the step's two responses, exactly as one rank does. (ZeRO 2:
    # at ZeRO 0 the grad_norm metric is each rank's own gradient before DeepSpeed's all-reduce.)
    runs = {}
    for nproc in (1, 2):
        out = tmp_path / f"rpp{nproc}"
        cmd = train_cmd(out, *DP_SETTINGS, "train.steps=1", "engine.zero_stage=2", algo="reinforce_pp")
        if nproc > 1:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                   "--standalone", *cmd[1:]]
        env = engine_env()
        env.pop("RANK", None)
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
        assert r.returncode == 0, r.stderr[-3000:]
        runs[nproc] = metrics(out)[0], load_file(out / "final" / "model.safetensors")
    (m1, w1), (m2, w2) = runs[1], runs[2]
    assert m1["rows"] == m2["rows"] == 2
    assert m1["grad_norm"] > 1e-3  # the two responses' rewards differ (spread_reward)
    assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-5)
    # One AdamW step moves each weight by ~lr = 1e-3 whatever its gradient (g / (|g| + eps)), so an
    # entry whose gradient is near eps turns the fp32 rounding of the split sums into up to ~1e-5
    # (observed 1.02e-5 at one of 16384 entries): 5e-5 is still 20x below the movement.
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], atol=5e-5, rtol=0)


def test_prompts_must_split_into_whole_groups(tmp_path):
    cmd = train_cmd(tmp_path / "odd", *DP_SETTINGS, "train.prompts_per_step=3")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
           *cmd[1:]]
    r = subprocess.run(cmd, env=engine_env(), capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert r.returncode != 0
    assert "3 prompts cannot be shared out in whole groups among 2 data-parallel ranks" in r.stderr


# ---------------------------------------------------------------- catalog check and metric merge
def _catalog_rank(rank: int, store: Path, queue) -> None:
    import types

    import torch.distributed as dist

    from policyzoo.catalog import load_catalog
    from policyzoo.contract import hookimpl
    from policyzoo.engine import dist as pdist
    from policyzoo.plugins.reward import COMPONENTS

    os.environ.update(RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    extra = []
    if rank == 1:  # a plugin installed on rank 1 only: one extra reward component
        base = next(c for c in COMPONENTS if c.slot == "reward")
        extra_cls = type("OnlyHere", (base,), {"name": "only_here"})
        extra = [types.SimpleNamespace(__name__="extra_plugin",
                                       register_components=hookimpl(lambda register: register(extra_cls)))]
    try:
        pdist.check_same_catalog(load_catalog(autoload=False, extra=extra))
        queue.put((rank, "no error"))
    except pdist.DistError as e:
        queue.put((rank, str(e)))
    dist.destroy_process_group()


def test_a_component_missing_on_one_rank_is_an_error_on_every_rank(tmp_path):
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    q, store = ctx.Queue(), tmp_path / "store"  # a file store: no port for another test to take
    procs = [ctx.Process(target=_catalog_rank, args=(r, store, q)) for r in (0, 1)]
    for p in procs:
        p.start()
    got = dict(q.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(30)
    for r in (0, 1):
        assert "rank 0 has no component reward/only_here (rank 1: (in-process)" in got[r], got[r]


def test_merged_metrics_add_counts_and_average_means():
    from policyzoo.engine.dist import merge_metrics

    a = {"step": 3, "rows": 8, "loss": 0.25, "reward_mean": 0.5, "time_train": 2.0, "skipped": 0,
         "skip_groups": [1], "kind": "train"}
    b = {"step": 3, "rows": 6, "loss": -0.75, "reward_mean": 0.25, "time_train": 3.0, "skipped": 1,
         "skip_groups": [5], "kind": "train"}
    m = merge_metrics([a, b])
    # rows 8 + 6; loss parts add to the full-batch loss 0.25 - 0.75; mean reward (0.5 + 0.25) / 2;
    # the slowest rank's time; one rank skipping means all skipped; group lists joined.
    assert m == {"step": 3, "rows": 14, "loss": -0.5, "reward_mean": 0.375, "time_train": 3.0, "skipped": 1,
                 "skip_groups": [1, 5], "kind": "train"}
