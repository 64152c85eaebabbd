"""vLLM-CPU's own GEMM kernel at decode shapes against the weight-read bound, with no engine around it.

A decode step of the default model (SmolLM2-135M, fp32) multiplies M rows (the batch's sequences, 8 in the
headline runs) by every weight once: per layer the fused QKV [576 -> 960], O [576 -> 576], the fused
gate/up [576 -> 3072] and down [1536 -> 576] projections, then the LM head [576 -> 49152]. At M = 8 that
is memory bound: the floor is the weights' bytes over the machine's copy bandwidth (``bound``, as
``rollout_over_bound`` in ``make bench`` counts it). This times, in one process, the matmuls of one step:

* ``vllm onednn_mm``: the kernel vLLM-CPU's linear layers call (``vllm._custom_ops.create_onednn_mm`` with
  the same arguments vLLM's ``dispatch_cpu_unquantized_gemm`` passes, then ``onednn_mm``);
* ``torch linear``: ``torch.nn.functional.linear`` on the same weights (torch's own CPU GEMM);
* ``weight read``: one pass reading every weight (``torch.Tensor.sum`` per matrix), the bandwidth a
  GEMM of M = 8 can at best reach.

Per step: the sum over the 121 matmuls, the median of ``--repeats`` steps after ``--warmup``; ``ratio``
= step / bound. If the kernel alone sits well above the bound, no engine around it reaches the bound:
the rest of a decode step (attention, sampling, the Python of the forward and the scheduler) only adds.

    python bench/decode_kernel.py --rows 8 --out bench/results/decode_kernel/result.md
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


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[8], help="M: sequences decoded together")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=20, help="timed steps per variant")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out", default=None, help="write the markdown table here")
    return p.parse_args(argv)


def shapes(a) -> list[tuple[int, int]]:
    """``(out, in)`` of every matmul in one decode step of the Llama-style ``a`` (``ceiling.Arch``)."""
    kv = a.kv_heads * a.head_dim
    q = a.heads * a.head_dim
    layer = [(q + 2 * kv, a.hidden), (a.hidden, q), (2 * a.mlp, a.hidden), (a.hidden, a.mlp)]
    return layer * a.layers + [(a.vocab, a.hidden)]


def step_times(fns, repeats: int, warmup: int) -> list[float]:
    """Seconds of one pass over ``fns`` (every matmul of a step), ``repeats`` times after ``warmup``."""
    for _ in range(warmup):
        for f in fns:
            f()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for f in fns:
            f()
        out.append(time.perf_counter() - t0)
    return out


def main(argv=None) -> dict:
    args = parse(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    from policyzoo.engine.process import setup_process

    setup_process(args.threads, 0.1)
    import ceiling
    import torch
    from vllm import _custom_ops as ops

    torch.set_num_threads(args.threads)
    if not ops._supports_onednn:
        raise SystemExit("this vLLM build has no oneDNN GEMM (vllm._custom_ops._supports_onednn is False)")
    load0 = os.getloadavg()
    bw0 = ceiling.copy_bandwidth(512 << 20, 5)
    a = ceiling.SMOLLM2_135M
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=g) * 0.02 for n, k in shapes(a)]
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    handlers = [ops.create_onednn_mm(w.t(), 32) for w in weights]  # as vLLM's dispatch does
    rows = {}
    for m in args.rows:
        xs = {k: torch.randn(m, k, generator=g) for k in {w.shape[1] for w in weights}}
        variants = {
            "vllm onednn_mm": [lambda h=h, x=xs[w.shape[1]]: ops.onednn_mm(h, x, None)
                               for h, w in zip(handlers, weights)],
            "torch linear": [lambda w=w, x=xs[w.shape[1]]: torch.nn.functional.linear(x, w) for w in weights],
            "weight read": [lambda w=w: w.sum() for w in weights],
        }
        rows[m] = {name: statistics.median(step_times(fns, args.repeats, args.warmup))
                   for name, fns in variants.items()}
    bw1 = ceiling.copy_bandwidth(512 << 20, 5)
    bw = max(bw0, bw1)
    res = {"rows": rows, "bytes": nbytes, "bound_s": nbytes / bw, "copy_gbs": (bw0 / 1e9, bw1 / 1e9),
           "load_before": load0, "load_after": os.getloadavg(), "matmuls": len(weights)}
    ceiling.report(table(res, args), args.out)
    return res


def table(res: dict, args) -> str:
    cmd = "python bench/decode_kernel.py " + " ".join(sys.argv[1:])
    b = res["copy_gbs"]
    loads = ["/".join(f"{x:.2f}" for x in res[k]) for k in ("load_before", "load_after")]
    lines = [f"The {res['matmuls']} matmuls of one fp32 decode step of SmolLM2-135M ({res['bytes'] / 1e6:.0f} MB of "
             f"weights), {args.threads} threads (`{cmd}`). Copy bandwidth {b[0]:.1f} / {b[1]:.1f} GB/s before / after "
             f"(the bound uses the higher: {res['bound_s'] * 1e3:.1f} ms a step); load (1/5/15 min) {loads[0]} before, "
             f"{loads[1]} after; median of {args.repeats} steps after {args.warmup}.", "",
             "| rows (M) | variant | ms a step | / bound | weights read at GB/s |", "|---|---|---|---|---|"]
    for m, by in res["rows"].items():
        for name, s in by.items():
            lines.append(f"| {m} | {name} | {s * 1e3:.1f} | {s / res['bound_s']:.2f} | {res['bytes'] / s / 1e9:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
