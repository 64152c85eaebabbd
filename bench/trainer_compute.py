"""The trainer's scoring + update, the code before issue 36 item 3 against today's, interleaved.

One process, one DeepSpeed trainer (ZeRO 0, fp32, grad clip 1.0, a reference model as GRPO's KL
needs) on the embedded default model (SmolLM2-135M) or ``--model``. One timed step is: the
reference's no-grad log-probs, then per micro-batch the policy's log-probs and entropy with
gradient, a loss, backward, then the optimizer step -- what ``learn`` asks of the trainer on an
on-policy GRPO step. The two paths run alternately (A B A B ...) on the same weights, so a shared
machine's load falls on both alike; the ratio of their medians is what counts.

* A, ``old``: the chunked log-prob code as it was (``git show <--old-rev>:core/engine/trainer/logprob.py``:
  the entropy in a second pass over the logits, a chunk-sized exp tensor and copy per chunk in
  backward) and DeepSpeed's own gradient clipping (a second norm pass, an all-reduce over a group
  of one, every gradient multiplied by the coefficient even at 1.0).
* B, ``new``: today's code.
* C, ``+old forward`` (``--with-old-forward``): B plus the no-grad forward of the old log-probs that
  an on-policy step skips (what the skip saves).

Prints the matmul rate of this machine (fp32, GFLOP/s, the model's MLP shape) and ``uptime``'s
load before and after, and writes the table to ``--out``.

    python bench/trainer_compute.py --reps 3 --out bench/results/trainer_compute/result.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="a model folder (default: the embedded SmolLM2-135M)")
    p.add_argument("--P", type=int, default=2, help="prompts")
    p.add_argument("--G", type=int, default=4, help="samples per prompt")
    p.add_argument("--prompt-len", type=int, default=100)
    p.add_argument("--response-len", type=int, default=128)
    p.add_argument("--micro-batches", type=int, default=1)
    p.add_argument("--reps", type=int, default=3, help="timed steps per path (after one untimed each)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--old-rev", default="d8c2b26", help="the commit whose logprob.py is the old path")
    p.add_argument("--with-old-forward", action="store_true", help="also time C: B + the skipped no-grad forward")
    p.add_argument("--out", default=None, help="write the markdown table here")
    return p.parse_args(argv)


def old_logprob_module(rev: str):
    """The module ``core/engine/trainer/logprob.py`` as of ``rev``, loaded under another name."""
    src = subprocess.run(["git", "show", f"{rev}:core/engine/trainer/logprob.py"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    mod = types.ModuleType("old_logprob")
    exec(compile(src, "old_logprob.py", "exec"), mod.__dict__)
    return mod


def rollout(vocab: int, args):
    import torch

    from policyzoo.contract import Rollout

    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, vocab, (args.prompt_len,), generator=g).tolist() for _ in range(args.P)]
    rows = args.P * args.G
    ids = torch.randint(10, vocab, (rows, args.response_len), generator=g)
    mask = torch.ones(rows, args.response_len, dtype=torch.bool)
    for i in range(rows):  # responses of different lengths, as sampled
        mask[i, args.response_len - 8 * (i % 4):] = False
    return Rollout(prompt_ids=[p for p in prompts for _ in range(args.G)], response_ids=ids, response_mask=mask,
                   rollout_logprobs=torch.zeros(ids.shape), group_ids=torch.arange(rows) // args.G,
                   truncated=torch.zeros(rows, dtype=torch.bool))


def step(tr, roll, micro: int, old_forward: bool) -> None:
    """Reference scoring, (optionally) the old log-probs' forward, forward + backward per micro-batch, update."""
    import torch

    ref = tr.ref_logprobs(roll)
    if old_forward:
        tr.logprobs(roll, grad=False)
    n = len(roll)
    tokens = float(roll.response_mask.sum())
    for k in range(micro):
        sel = (torch.arange(n) % micro) == k
        mb = roll.select(sel)
        lp, ent = tr.logprobs(mb, grad=True, entropy=True)
        adv = torch.linspace(-1, 1, len(mb))[:, None]
        ratio = torch.exp(lp - lp.detach())
        kl = torch.exp(ref[sel] - lp) - (ref[sel] - lp) - 1  # k3
        loss = ((-adv * ratio + 0.04 * kl) * mb.response_mask).sum() / tokens
        tr.backward(loss)
    tr.step()


def main(argv=None) -> dict:
    args = parse(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    from policyzoo.engine.process import setup_process

    setup_process(args.threads, 0.1)
    import ceiling
    import torch

    from policyzoo.config_sections import EngineSettings, ModelSettings, TrainSettings
    from policyzoo.engine.models import resolve_model
    from policyzoo.engine.trainer import clipping, prefix
    from policyzoo.engine.trainer.deepspeed_trainer import Trainer

    torch.set_num_threads(args.threads)
    load0 = os.getloadavg()
    gflops = ceiling.matmul_rate(2048, 576, 1536, torch.float32, 5) / 1e9
    info = resolve_model(args.model)
    tr = Trainer(info, ModelSettings(), TrainSettings(lr=1e-7, weight_decay=0.0, grad_clip=1.0),
                 EngineSettings(zero_stage=0, critic_lr=1e-7),
                 need_ref=True, need_critic=False)
    roll = rollout(tr.engine.module.config.vocab_size, args)
    old = old_logprob_module(args.old_rev)
    new_fused, new_clips = prefix.fused_token_logprobs, clipping.clips_itself

    def use(path: str):
        if path == "old":
            prefix.fused_token_logprobs = lambda lg, t, temp, e, eg=False: (
                new_fused(lg, t, temp, e, eg) if eg else old.fused_token_logprobs(lg, t, temp, e))
            clipping.clips_itself = lambda engine, world: False
        else:
            prefix.fused_token_logprobs, clipping.clips_itself = new_fused, new_clips

    paths = ["old", "new"] + (["+old forward"] if args.with_old_forward else [])
    times: dict[str, list[float]] = {p: [] for p in paths}
    for rep in range(args.reps + 1):
        for p in paths:
            use("new" if p == "+old forward" else p)
            t0 = time.perf_counter()
            step(tr, roll, args.micro_batches, p == "+old forward")
            if rep:  # the first round warms up
                times[p].append(time.perf_counter() - t0)
    use("new")
    load1 = os.getloadavg()
    med = {p: statistics.median(v) for p, v in times.items()}
    res = {"median_s": med, "times": times, "ratio_old_over_new": med["old"] / med["new"], "gflops_fp32": gflops,
           "load_before": load0, "load_after": load1}
    ceiling.report(table(res, args), args.out)
    return res


def table(res: dict, args) -> str:
    cmd = "python bench/trainer_compute.py " + " ".join(sys.argv[1:])
    lines = [f"Trainer scoring + update, P = {args.P} x G = {args.G}, prompt {args.prompt_len} tokens, responses "
             f"<= {args.response_len}, {args.micro_batches} micro-batch(es), fp32, ZeRO 0, {args.threads} threads "
             f"(`{cmd}`). Machine: fp32 matmul {res['gflops_fp32']:.0f} GFLOP/s at the model's MLP shape; "
             f"load (1/5/15 min) {'/'.join(f'{x:.2f}' for x in res['load_before'])} before, "
             f"{'/'.join(f'{x:.2f}' for x in res['load_after'])} after. Paths interleaved, {args.reps} timed steps "
             "each after one untimed round.", "", "| path | median s | steps (s) |", "|---|---|---|"]
    for p, v in res["times"].items():
        lines.append(f"| {p} | {res['median_s'][p]:.2f} | {', '.join(f'{x:.2f}' for x in v)} |")
    lines += ["", f"old / new = {res['ratio_old_over_new']:.3f}"]
    if "+old forward" in res["median_s"]:
        lines.append(f"(new + the skipped old-logprob forward) / new = "
                     f"{res['median_s']['+old forward'] / res['median_s']['new']:.3f}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
