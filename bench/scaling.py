"""Scaling: how policyzoo's GRPO step time grows with G, response length and prompts per step.

One process loads the engine once (as ``policyzoo train`` does: DeepSpeed trainer + vLLM rollout,
sized for the longest response asked for), then for each point sets the sampler's ``n`` and
``max_tokens`` and the prompts per step, takes ``--point-warmup`` + ``--repeats`` optimizer steps
(plus ``--warmup`` unmeasured ones before the first point) with
``policyzoo.step.train_step`` and records the medians of the time split (rollout / reward / train /
sync) and rollout tokens/s. The weights keep training across points (lr small), as in a run.
Points: G in ``--Gs`` (at ``--base-len``, ``--base-P``), length in ``--lens`` (at ``--base-G``), P in
``--Ps``. Writes ``results.json``, ``table.md`` and, with matplotlib, ``scaling.png`` (stacked time
split per point).

Run: ``python bench/scaling.py --Gs 4 8 16 --lens 32 64 128 --Ps 1 2 4 --repeats 2 --threads 2``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PARTS = ("time_rollout", "time_reward", "time_train", "time_sync")


def points(a) -> list[tuple[str, int, int, int]]:
    """(varied, P, G, L) without duplicates, in the order measured."""
    out = [("G", a.base_P, g, a.base_len) for g in a.Gs]
    out += [("length", a.base_P, a.base_G, n) for n in a.lens]
    out += [("P", p, a.base_G, a.base_len) for p in a.Ps]
    seen, uniq = set(), []
    for p in out:
        if p[1:] not in seen:
            seen.add(p[1:])
            uniq.append(p)
    return uniq


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algo", default="grpo")
    ap.add_argument("--Gs", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--lens", type=int, nargs="+", default=[32, 64, 128])
    ap.add_argument("--Ps", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--base-G", type=int, default=8)
    ap.add_argument("--base-len", type=int, default=64)
    ap.add_argument("--base-P", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2, help="measured steps per point")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured steps before the first point")
    ap.add_argument("--point-warmup", type=int, default=0, help="unmeasured steps at the start of each point")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-7)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--override", action="append", help="extra policyzoo key=value (repeatable)")
    ap.add_argument("--out", default=str(HERE / "results" / "scaling"))
    ap.add_argument("--dry-run", action="store_true", help="print the points and exit")
    a = ap.parse_args(argv)
    nums = a.Gs + a.lens + a.Ps + [a.base_G, a.base_len, a.base_P, a.repeats, a.threads]
    if min(nums) < 1 or min(a.warmup, a.point_warmup) < 0 or min(a.Gs + [a.base_G]) < 2:
        ap.error("every size must be >= 1 (G >= 2), warmups >= 0")
    return a


def run_points(a) -> dict:
    from policyzoo.engine.process import setup_process
    from policyzoo.run_config import load_config

    longest = max(a.lens + [a.base_len])
    cfg = load_config(None, a.algo, [f"algorithm.sample.max_tokens={longest}", f"train.lr={a.lr}",
                                     f"engine.threads={a.threads}", f"model.dtype={a.dtype}",
                                     f"output_dir={tempfile.mkdtemp(prefix='policyzoo-scaling-')}/run"]
                      + list(a.override or []))
    setup_process(cfg.engine.threads, cfg.engine.kv_cache_gb)
    from policyzoo.data import batch_at
    from policyzoo.engine.run.session import prepare, start
    from policyzoo.step import train_step

    t0 = time.perf_counter()
    s = start(prepare(cfg, None))
    res = {"args": vars(a), "startup_s": time.perf_counter() - t0, "points": []}
    batches, step = 0, 0
    for varied, P, G, L in points(a):
        s.run.sample.params = s.run.sample.params.model_copy(update={"n": G, "max_tokens": L})

        def next_prompts(P=P):
            nonlocal batches
            batches += 1
            return batch_at(s.task.train_rows, P, s.task.seed, batches - 1)

        recs = []
        warm = a.point_warmup + (a.warmup if not res["points"] else 0)
        for i in range(warm + a.repeats):
            step += 1
            t1 = time.perf_counter()
            m = train_step(s.run, s.policy, next_prompts, seed=cfg.train.seed * 1_000_003 + step, settings=s.settings)
            m["time_step"] = time.perf_counter() - t1
            m["rollout_tokens"] = m["response_length_mean"] * m["rows"]
            if i >= warm:
                recs.append(m)
        med = {k: statistics.median(r.get(k, 0.0) for r in recs) for k in PARTS + ("time_step", "rollout_tokens")}
        med.update(varied=varied, P=P, G=G, L=L, rows=P * G)
        med["rollout_tokens_per_s"] = med["rollout_tokens"] / med["time_rollout"] if med["time_rollout"] else 0.0
        res["points"].append(med)
        print(f"{varied}: P={P} G={G} L={L}: step {med['time_step']:.1f} s "
              + ", ".join(f"{k[5:]} {med[k]:.1f}" for k in PARTS), flush=True)
    return res


def table(res: dict) -> str:
    lines = ["| varied | P | G | L | rows | step s | rollout s | reward s | train s | sync s | rollout tok/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in res["points"]:
        lines.append(f"| {p['varied']} | {p['P']} | {p['G']} | {p['L']} | {p['rows']} | {p['time_step']:.1f} | "
                     + " | ".join(f"{p[k]:.2f}" for k in PARTS) + f" | {p['rollout_tokens_per_s']:.0f} |")
    return "\n".join(lines)


def plot(res: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    pts = res["points"]
    labels = [f"{p['varied']}\nP{p['P']} G{p['G']} L{p['L']}" for p in pts]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(pts)), 3.6))
    bottom = [0.0] * len(pts)
    for k in PARTS:
        vals = [p[k] for p in pts]
        ax.bar(labels, vals, bottom=bottom, label=k[5:])
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set(ylabel="seconds per step (median)", title="policyzoo GRPO step time split")
    ax.legend()
    ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> dict:
    a = parse(argv)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts OpenMP (as `make` does)
    if a.dry_run:
        for p in points(a):
            print(p)
        return {}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = run_points(a)
    (out / "results.json").write_text(json.dumps(res, indent=1))
    (out / "table.md").write_text(table(res) + "\n")
    plot(res, out / "scaling.png")
    print(table(res))
    return res


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
