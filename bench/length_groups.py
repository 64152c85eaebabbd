"""The shared-prompt trainer's length groups: what one more model call costs against padded positions.

``engine.share_prompt`` scores rows in length groups (``core/engine/trainer/prefix.py``
``length_buckets``), each padded to its own longest response; the split minimises padded row-positions
plus ``overhead`` positions per model call. This times one on-policy GRPO trainer step
(``bench/trainer_compute.py``'s: reference log-probs, log-probs + entropy with gradient, loss, backward,
fused AdamW) on the default model with the split each ``--overheads`` value gives, interleaved in one
process (A B C D A B C D ...), for two length patterns of P = 2 x G = 4 rows under a 100-token prompt:

* ``close``: 128, 120, 112, 104 twice (``trainer_compute``'s rollout);
* ``spread``: 128, 128, 128, 96, 64, 48, 32, 16 (a few long answers and a tail of short ones).

The overhead at which the measured time is lowest is the one to keep.

    python bench/length_groups.py --reps 3 --out bench/results/length_groups/result.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

PATTERNS = {"close": [128, 120, 112, 104] * 2, "spread": [128, 128, 128, 96, 64, 48, 32, 16]}


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--overheads", type=int, nargs="+", default=[16, 64, 128, 256, 10**9],
                   help="row-positions charged per model call (10**9: one group)")
    p.add_argument("--reps", type=int, default=3, help="timed rounds (after one untimed round)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="write the markdown table here")
    return p.parse_args(argv)


def with_lengths(roll, lengths: list[int]):
    """``roll`` with row i's response mask True on its first ``lengths[i]`` tokens only."""
    for i, n in enumerate(lengths):
        roll.response_mask[i] = False
        roll.response_mask[i, :n] = True
    return roll


def main(argv=None) -> dict:
    args = parse(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    from policyzoo.engine.process import setup_process

    setup_process(args.threads, 0.1)
    import ceiling
    import torch
    import trainer_compute

    from policyzoo.config_sections import EngineSettings, ModelSettings, TrainSettings
    from policyzoo.engine.models import resolve_model
    from policyzoo.engine.trainer import prefix
    from policyzoo.engine.trainer.deepspeed_trainer import Trainer

    torch.set_num_threads(args.threads)
    load0, rate0 = os.getloadavg(), ceiling.matmul_rate(2048, 576, 1536, torch.float32, 10)
    shape = SimpleNamespace(P=2, G=4, prompt_len=100, response_len=128)
    tr = Trainer(resolve_model(None), ModelSettings(), TrainSettings(lr=1e-7, weight_decay=0.0, grad_clip=1.0),
                 EngineSettings(zero_stage=0, critic_lr=1e-7),
                 need_ref=True, need_critic=False)
    split, kept, times = prefix.length_buckets, prefix.CALL_OVERHEAD, {}
    try:
        for name, lengths in PATTERNS.items():
            roll = with_lengths(trainer_compute.rollout(ceiling.SMOLLM2_135M.vocab, shape), lengths)
            times[name] = {o: [] for o in args.overheads}
            for rep in range(args.reps + 1):
                for o in args.overheads:
                    prefix.CALL_OVERHEAD = o
                    t0 = time.perf_counter()
                    trainer_compute.step(tr, roll, 1, False)
                    if rep:  # the first round warms up
                        times[name][o].append(time.perf_counter() - t0)
    finally:
        prefix.CALL_OVERHEAD = kept
    res = {"times": times, "groups": {n: {o: split(ls, o) for o in args.overheads} for n, ls in PATTERNS.items()},
           "gflops_fp32": (rate0 / 1e9, ceiling.matmul_rate(2048, 576, 1536, torch.float32, 10) / 1e9),
           "load_before": load0, "load_after": os.getloadavg()}
    ceiling.report(table(res, args), args.out)
    return res


def table(res: dict, args) -> str:
    cmd = "python bench/length_groups.py " + " ".join(sys.argv[1:])
    g = res["gflops_fp32"]
    loads = ["/".join(f"{x:.2f}" for x in res[k]) for k in ("load_before", "load_after")]
    lines = [f"One on-policy GRPO trainer step of the default model (fp32, {args.threads} threads, P = 2 x G = 4, "
             f"prompt 100 tokens; `{cmd}`). fp32 matmul {g[0]:.0f} / {g[1]:.0f} GFLOP/s before / after; load "
             f"(1/5/15 min) {loads[0]} before, {loads[1]} after. Overheads interleaved, {args.reps} timed rounds "
             "after one untimed; ratio = median / the pattern's lowest median.", "",
             "| lengths | overhead (positions a call) | groups | median s | rounds (s) | ratio |",
             "|---|---|---|---|---|---|"]
    for name, by in res["times"].items():
        med = {o: statistics.median(v) for o, v in by.items()}
        best = min(med.values())
        for o, v in by.items():
            groups = " ".join("{" + ",".join(str(PATTERNS[name][r]) for r in grp) + "}"
                              for grp in res["groups"][name][o])
            label = "one group" if o >= 10**9 else str(o)
            lines.append(f"| {name} | {label} | {groups} | {med[o]:.2f} | {', '.join(f'{x:.2f}' for x in v)} | "
                         f"{med[o] / best:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
