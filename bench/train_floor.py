"""The training step's floor: policyzoo's trainer against the same work in plain transformers + torch.

``train_over_ceiling`` (``make bench``) divides the training time by FLOPs / the machine's matmul rate.
That ceiling assumes every FLOP runs at the rate of one large fp32 matmul. This script measures, in one
process with the paths interleaved (A B C A B C ...), how close code outside policyzoo gets to it on the
same batch, so what is left can be charged to the project or to the libraries:

* ``policyzoo``: the trainer of a real on-policy GRPO step (DeepSpeed ZeRO 0, fp32, shared-prompt
  scoring, chunked log-probs + entropy, the reference's no-grad log-probs, k3 KL, gradient clipping at
  1.0, fused AdamW) -- ``bench/trainer_compute.py``'s ``new`` path;
* ``transformers + torch``: the same step as a plain loop writes it (as TRL does on CPU): every row
  scored in full by the Hugging Face model (logits on the response positions only,
  ``logits_to_keep``), ``log_softmax`` + ``gather``, the entropy without gradient, the same loss,
  ``backward``, ``clip_grad_norm_(1.0)``, ``torch.optim.AdamW(fused=True)``;
* ``layers only``: the model's decoder layers alone, forward + backward over the same full rows
  (no LM head, no loss but a sum, no optimizer): the rate transformers' Llama layers and torch's CPU
  kernels reach at these shapes, the floor of any trainer built on them.

Each path's ceiling is its own FLOPs (``bench/ceiling.py``'s ``step_flops``: shared-prompt for
policyzoo, per row for the plain loop; layers: 3 x rows x (2 x body params x tokens + attention)) over the
matmul rate at the model's MLP shape measured in the same process (best of 10, before and after), plus
the optimizer's memory-bound ceiling (7 passes over the fp32 parameters at the measured copy bandwidth)
where an optimizer runs. A path at ratio R to its ceiling runs its FLOPs at 1/R of the matmul rate.

    python bench/train_floor.py --reps 3 --out bench/results/train_floor/result.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

PATHS = ("policyzoo", "transformers + torch", "layers only")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--P", type=int, default=2, help="prompts")
    p.add_argument("--G", type=int, default=4, help="samples per prompt")
    p.add_argument("--prompt-len", type=int, default=100)
    p.add_argument("--response-len", type=int, default=128)
    p.add_argument("--reps", type=int, default=3, help="timed rounds (after one untimed round)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="write the markdown table here")
    return p.parse_args(argv)


def plain_step(policy, ref, opt, ids, mask, T: int) -> None:
    """One GRPO step as a plain transformers + torch loop: ``ids`` ``[B, S]`` full rows (prompt + response),
    ``mask`` ``[B, T]`` the response tokens that count."""
    import torch

    targets = ids[:, -T:]
    with torch.no_grad():
        ref_lp = torch.log_softmax(ref(input_ids=ids, logits_to_keep=T + 1).logits[:, :-1], -1)
        ref_lp = ref_lp.gather(-1, targets[..., None])[..., 0]
    logits = policy(input_ids=ids, logits_to_keep=T + 1).logits[:, :-1]
    logp = torch.log_softmax(logits, -1)
    lp = logp.gather(-1, targets[..., None])[..., 0]
    with torch.no_grad():
        entropy = -(logp.exp() * logp).sum(-1)  # the metric every peer logs
    del entropy
    adv = torch.linspace(-1, 1, len(ids))[:, None]
    ratio = torch.exp(lp - lp.detach())
    kl = torch.exp(ref_lp - lp) - (ref_lp - lp) - 1  # k3
    loss = ((-adv * ratio + 0.04 * kl) * mask).sum() / mask.sum()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


def layers_step(model, ids) -> None:
    """Forward + backward of the decoder layers alone (``model.model``: embeddings, layers, final norm)."""
    model.model(input_ids=ids).last_hidden_state.sum().backward()
    model.zero_grad(set_to_none=True)


def ceilings(args, rate: float, bandwidth: float) -> dict[str, float]:
    """Seconds of each path at the ceiling (see the module docstring)."""
    import ceiling as c

    a, B, S = c.SMOLLM2_135M, args.P * args.G, args.prompt_len + args.response_len
    opt = 7 * a.params * 4 / bandwidth
    shared = c.step_flops(a, args.P, args.G, args.prompt_len, args.response_len, shared_prompt=True)
    per_row = c.step_flops(a, args.P, args.G, args.prompt_len, args.response_len, shared_prompt=False)
    train = ("train: forward+backward", "reference forward")
    layers = 3.0 * B * (2.0 * a.body_params * S + c.attention_flops(a, S, 0))
    return {"policyzoo": sum(shared[k] for k in train) / rate + opt,
            "transformers + torch": sum(per_row[k] for k in train) / rate + opt,
            "layers only": layers / rate}


def main(argv=None) -> dict:
    args = parse(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    from policyzoo.engine.process import setup_process

    setup_process(args.threads, 0.1)
    import ceiling
    import torch
    import trainer_compute
    from transformers import AutoModelForCausalLM

    from policyzoo.config_sections import EngineSettings, ModelSettings, TrainSettings
    from policyzoo.engine.models import resolve_model
    from policyzoo.engine.trainer.deepspeed_trainer import Trainer

    torch.set_num_threads(args.threads)
    load0 = os.getloadavg()
    a = ceiling.SMOLLM2_135M
    rate0 = ceiling.matmul_rate(2048, a.hidden, a.mlp, torch.float32, 10)
    bw0 = ceiling.copy_bandwidth(512 << 20, 5)
    info = resolve_model(None)
    tr = Trainer(info, ModelSettings(), TrainSettings(lr=1e-7, weight_decay=0.0, grad_clip=1.0),
                 EngineSettings(zero_stage=0, critic_lr=1e-7),
                 need_ref=True, need_critic=False)
    roll = trainer_compute.rollout(a.vocab, args)
    policy, ref = (AutoModelForCausalLM.from_pretrained(str(info.path), dtype=torch.float32) for _ in range(2))
    ref.eval()
    ref.requires_grad_(False)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-7, weight_decay=0.0, fused=True)
    ids = torch.cat([torch.tensor(roll.prompt_ids), roll.response_ids], 1)
    mask = roll.response_mask.float()
    run = {"policyzoo": lambda: trainer_compute.step(tr, roll, 1, False),
           "transformers + torch": lambda: plain_step(policy, ref, opt, ids, mask, args.response_len),
           "layers only": lambda: layers_step(policy, ids)}
    times: dict[str, list[float]] = {p: [] for p in PATHS}
    for rep in range(args.reps + 1):
        for p in PATHS:
            t0 = time.perf_counter()
            run[p]()
            if rep:  # the first round warms up
                times[p].append(time.perf_counter() - t0)
    rate1 = ceiling.matmul_rate(2048, a.hidden, a.mlp, torch.float32, 10)
    bw1 = ceiling.copy_bandwidth(512 << 20, 5)
    load1 = os.getloadavg()
    rate, bw = max(rate0, rate1), max(bw0, bw1)
    ceil = ceilings(args, rate, bw)
    med = {p: statistics.median(v) for p, v in times.items()}
    res = {"median_s": med, "times": times, "ceiling_s": ceil, "over_ceiling": {p: med[p] / ceil[p] for p in PATHS},
           "gflops_fp32": (rate0 / 1e9, rate1 / 1e9), "copy_gbs": (bw0 / 1e9, bw1 / 1e9),
           "load_before": load0, "load_after": load1}
    ceiling.report(table(res, args), args.out)
    return res


def table(res: dict, args) -> str:
    cmd = "python bench/train_floor.py " + " ".join(sys.argv[1:])
    g, b = res["gflops_fp32"], res["copy_gbs"]
    loads = ["/".join(f"{x:.2f}" for x in res[k]) for k in ("load_before", "load_after")]
    lines = [f"One on-policy GRPO training step, P = {args.P} x G = {args.G}, prompt {args.prompt_len} tokens, "
             f"responses <= {args.response_len}, fp32, {args.threads} threads (`{cmd}`). Machine: fp32 matmul "
             f"{g[0]:.0f} / {g[1]:.0f} GFLOP/s at the model's MLP shape, copy {b[0]:.1f} / {b[1]:.1f} GB/s (before / "
             f"after; the ceiling uses the higher); load (1/5/15 min) {loads[0]} before, {loads[1]} after. Paths "
             f"interleaved, {args.reps} timed rounds after one untimed.", "",
             "| path | median s | rounds (s) | ceiling s | median / ceiling |", "|---|---|---|---|---|"]
    for p in PATHS:
        lines.append(f"| {p} | {res['median_s'][p]:.2f} | {', '.join(f'{x:.2f}' for x in res['times'][p])} | "
                     f"{res['ceiling_s'][p]:.2f} | {res['over_ceiling'][p]:.2f} |")
    m = res["median_s"]
    ratio = m["policyzoo"] / m["transformers + torch"]
    lines += ["", f"policyzoo / transformers + torch (same step, seconds) = {ratio:.3f}"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
