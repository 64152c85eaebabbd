"""Does torch.compile pay for training on CPU? The default model's forward + backward, eager against
compiled decoder layers, one fresh process each, one after the other.

A training step's non-matmul third (RMSNorm, SiLU, rotary, residual adds: elementwise work in fp32)
is what a compiler could fuse. Each variant runs, in its own process, the default model
(SmolLM2-135M-Instruct, fp32, SDPA attention, 2 threads) on 8 random rows of ``--tokens`` tokens:
forward, the log-softmax of the last 128 positions, the mean log-prob of the given ids, backward.
``compile``: every decoder layer through ``torch.compile(dynamic=True)`` (sequence lengths change
every step in training, so the shapes are dynamic); the first step includes the compilation. Then
``--steps`` steps at lengths around ``--tokens`` (the median is printed), and the ratio
compiled / eager.

    python bench/train_compile.py            # ~3 min on an idle 2-core machine

Timings are only meaningful on an idle machine; the machine's rates and load are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def one(mode: str, tokens: int, steps: int, threads: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from policyzoo.engine.models import default_model_path

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(default_model_path()), dtype=torch.float32,
                                                 attn_implementation="sdpa")
    model.train()
    if mode == "compile":
        for layer in model.model.layers:
            layer.compile(dynamic=True)

    def step(t: int) -> float:
        ids = torch.randint(0, model.config.vocab_size, (8, t))
        start = time.perf_counter()
        hidden = model.model(input_ids=ids).last_hidden_state
        logits = model.lm_head(hidden[:, -128:])
        loss = -torch.log_softmax(logits, -1).gather(-1, ids[:, -128:, None]).mean()
        loss.backward()
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    first = step(tokens)
    lengths = [tokens + d for d in (-10, 10, 0, 5, -5, 3, -3)][:steps]
    return {"mode": mode, "first_s": first, "steps_s": [step(t) for t in lengths]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child", choices=("eager", "compile"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print("RESULT " + json.dumps(one(a.child, a.tokens, a.steps, a.threads)), flush=True)
        return
    import ceiling

    rates = ceiling.measure(a.threads, 10, 1024)
    print(f"machine: fp32 {rates[f'fp32 {ceiling.MODEL_SHAPE}'] / 1e9:.0f} GFLOP/s at the model's shape, copy "
          f"{rates['copy bandwidth'] / 1e9:.1f} GB/s; load {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    out = {}
    for mode in ("eager", "compile"):
        proc = subprocess.run([sys.executable, __file__, "--child", mode, "--tokens", str(a.tokens), "--steps",
                               str(a.steps), "--threads", str(a.threads)], capture_output=True, text=True,
                              timeout=1800, check=True)
        out[mode] = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
        r = out[mode]
        print(f"{mode}: first step {r['first_s']:.1f} s, then median {statistics.median(r['steps_s']):.2f} s "
              f"({', '.join(f'{x:.2f}' for x in r['steps_s'])})", flush=True)
    ratio = statistics.median(out["compile"]["steps_s"]) / statistics.median(out["eager"]["steps_s"])
    print(f"compiled / eager, forward + backward of 8 x ~{a.tokens} tokens: {ratio:.2f}; load now "
          f"{os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
