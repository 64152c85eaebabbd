"""Runs of two settings, seed by seed (same prompts): the learning and the sampler/trainer agreement side by side.

``python bench/paired_runs.py A_DIR B_DIR [--seeds 0 1]`` reads ``A_DIR/seedS`` and ``B_DIR/seedS`` (folders of
``policyzoo train`` or ``policyzoo compare``) and prints, per seed and over the seeds:

* held-out accuracy before and after (the runs' own evaluations) and its paired difference B - A;
* the paired per-step training reward difference B - A: the mean over steps, its standard error as if the steps
  were independent (s / sqrt(n)) and over 10-step blocks (the standard deviation of the block means / sqrt(blocks):
  the steps of one run are correlated through its policy), and the reward and ``kl_ref`` per 10-step block;
* the sync check (``sync_max_diff``, ``sync_mean_diff``) and the mismatch correction's metrics (mean |log ratio|
  sampler vs trainer per token, the fraction of tokens whose weight was truncated);
* the median step, rollout and train seconds after the first step.
"""

from __future__ import annotations

import argparse
import json
import statistics as st
from pathlib import Path

BLOCK = 10


def records(run: Path, kind: str) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in rows if r.get("kind") == kind]


def blocks(values: list[float], size: int = BLOCK) -> list[float]:
    """Means of consecutive blocks of ``size`` (a last partial block included)."""
    return [st.mean(values[i:i + size]) for i in range(0, len(values), size)]


def paired(a: list[float], b: list[float]) -> dict:
    """Mean of b - a over the steps both have, its standard error over steps and over 10-step blocks."""
    d = [y - x for x, y in zip(a, b)]
    bm = blocks(d)
    return {"mean": st.mean(d), "se_steps": st.stdev(d) / len(d) ** 0.5 if len(d) > 1 else float("nan"),
            "se_blocks": st.stdev(bm) / len(bm) ** 0.5 if len(bm) > 1 else float("nan"), "steps": len(d)}


def summary(run: Path) -> dict:
    train, evals = records(run, "train"), records(run, "eval")
    col = lambda k: [r[k] for r in train if r.get(k) is not None]  # noqa: E731
    med = lambda k: st.median(col(k)[1:]) if len(col(k)) > 1 else float("nan")  # noqa: E731
    return {"before": evals[0]["eval_accuracy"], "after": evals[-1]["eval_accuracy"], "reward": col("reward_mean"),
            "kl": col("kl_ref"), "sync_max": col("sync_max_diff"), "sync_mean": col("sync_mean_diff"),
            "log_ratio": col("mismatch/log_ratio_abs_mean"), "truncated": col("mismatch/truncated_frac"),
            "step_s": med("time_step"), "rollout_s": med("time_rollout"), "train_s": med("time_train")}


def _fmt(xs: list[float]) -> str:
    return " ".join(f"{x:.3f}" for x in xs)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a"), ap.add_argument("b")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = ap.parse_args(argv)
    out = {}
    for s in args.seeds:
        a, b = summary(Path(args.a) / f"seed{s}"), summary(Path(args.b) / f"seed{s}")
        p = paired(a["reward"], b["reward"])
        out[s] = {"a": a, "b": b, "reward_diff": p, "after_diff": b["after"] - a["after"]}
        print(f"seed {s}: held-out A {a['before']:.2f} -> {a['after']:.2f}, B {b['before']:.2f} -> {b['after']:.2f}"
              f" (after B - A {b['after'] - a['after']:+.2f})")
        print(f"  reward B - A per step {p['mean']:+.3f} (SE {p['se_steps']:.3f} over {p['steps']} steps, "
              f"{p['se_blocks']:.3f} over {BLOCK}-step blocks)")
        for name, r in (("A", a), ("B", b)):
            sync = (f"sync max {max(r['sync_max']):.3g} (median {st.median(r['sync_max']):.3g}), mean diff max "
                    f"{max(r['sync_mean']):.3g}") if r["sync_max"] else "sync check off"
            mis = (f"|log ratio| {st.mean(r['log_ratio']):.3g}, truncated {st.mean(r['truncated']):.3g}"
                   if r["log_ratio"] else "no correction metrics")
            print(f"  {name}: reward/block {_fmt(blocks(r['reward']))}; kl_ref/block {_fmt(blocks(r['kl']))}")
            print(f"     {sync}; {mis}; median step {r['step_s']:.2f} s (rollout {r['rollout_s']:.2f}, train "
                  f"{r['train_s']:.2f})")
    if len(out) > 1:
        diffs = [v["reward_diff"]["mean"] for v in out.values()]
        after = [v["after_diff"] for v in out.values()]
        print(f"over {len(out)} seeds: reward B - A {_fmt(diffs)} (mean {st.mean(diffs):+.3f}); held-out after "
              f"B - A {_fmt(after)} (mean {st.mean(after):+.3f})")
    return out


if __name__ == "__main__":
    main()
