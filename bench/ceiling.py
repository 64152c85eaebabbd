"""The ceiling: this machine's matmul rate and memory bandwidth, and the FLOPs of one GRPO step.

Measured here (same script, same process): dense matmul rate in fp32 and bf16 (square and the
model's own [tokens x 576] x [576 x 1536] shape) and copy bandwidth. Counted: the FLOPs of one
GRPO step on SmolLM2-135M (Llama: hidden 576, MLP 1536, 30 layers, 9 heads / 3 KV heads of 64,
vocabulary 49152, tied embeddings; 134.5M parameters):

* matmul FLOPs: 2 x N per token forward, backward 2x forward (the 6 N per token of training);
  the LM head (576 x 49152 = 28.3M MACs per token) only where logits are needed;
* attention: QK^T and AV, 2 x 2 x layers x hidden x context per token (causal: context = position);
* decode: one forward per generated token with a KV cache (2 N + attention over the context), and
  it is memory-bound: every decode step reads all weights once (134.5M x 4 bytes in fp32);
* prefill: the prompt once per prompt (prefix caching shares it across the G samples);
* training and reference scoring: the prompt once per prompt too (policyzoo's shared-prompt
  scoring), the responses per row; the table notes what scoring every row in full would cost.

The ceiling time of each part is FLOPs / matmul rate (and, for decode, also steps x weight bytes /
bandwidth; the larger bound counts). ``--metrics run/metrics.jsonl`` compares the engine's
measured time split (median ``time_rollout`` / ``time_train`` / ...) with it.

Run: ``python bench/ceiling.py [--P 4 --G 8 --prompt-len 96 --response-len 64] [--threads 2]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import summary as bench_summary  # bench/summary.py (the script's folder is on sys.path)
import torch


@dataclass(frozen=True)
class Arch:
    hidden: int = 576
    mlp: int = 1536
    layers: int = 30
    heads: int = 9
    kv_heads: int = 3
    head_dim: int = 64
    vocab: int = 49152

    @property
    def body_params(self) -> int:  # matmul weights of the layers (norms are not matmuls)
        h, kv = self.hidden, self.kv_heads * self.head_dim
        return self.layers * (2 * h * h + 2 * h * kv + 3 * h * self.mlp)

    @property
    def head_params(self) -> int:  # LM head = tied embedding matrix
        return self.hidden * self.vocab

    @property
    def params(self) -> int:  # + embeddings (tied with the head) + 2 norms per layer + final norm
        return self.body_params + self.head_params + (2 * self.layers + 1) * self.hidden


SMOLLM2_135M = Arch()


def arch_from_config(path: str) -> Arch:
    """An :class:`Arch` from a Hugging Face ``config.json`` (Llama-style keys)."""
    c = json.load(open(path))
    heads = c["num_attention_heads"]
    return Arch(hidden=c["hidden_size"], mlp=c["intermediate_size"], layers=c["num_hidden_layers"], heads=heads,
                kv_heads=c.get("num_key_value_heads", heads), head_dim=c.get("head_dim") or c["hidden_size"] // heads,
                vocab=c["vocab_size"])


def attention_flops(a: Arch, query_tokens: int, context_start: int) -> float:
    """QK^T + AV FLOPs of ``query_tokens`` consecutive causal positions after ``context_start``."""
    q = a.heads * a.head_dim
    ctx = sum(context_start + i + 1 for i in range(query_tokens))
    return 4.0 * a.layers * q * ctx


def step_flops(a: Arch, P: int, G: int, prompt_len: int, response_len: int, kl: bool = True,
               logits_everywhere: bool = False, shared_prompt: bool = False) -> dict[str, float]:
    """FLOPs of one on-policy GRPO step (one optimizer step, one update per batch).

    Scoring per row (``shared_prompt=False``, as TRL): B rows x (prompt + response) positions.
    Shared prompt (policyzoo's default, ``engine.share_prompt``): P prompts once, then B rows x
    (response - 1) positions attending to the prompt's cache; logits at the prompt's last position."""
    B, S = P * G, prompt_len + response_len
    head_tokens = S if logits_everywhere else response_len
    fwd_row = 2.0 * a.body_params * S + 2.0 * a.head_params * head_tokens + attention_flops(a, S, 0)
    if shared_prompt:
        r = response_len - 1
        head_p = prompt_len if logits_everywhere else 1
        fwd_row = (P * (2.0 * a.body_params * prompt_len + 2.0 * a.head_params * head_p
                        + attention_flops(a, prompt_len, 0))
                   + B * (2.0 * (a.body_params + a.head_params) * r + attention_flops(a, r, prompt_len))) / B
    prefill = P * (2.0 * (a.body_params + a.head_params) * prompt_len + attention_flops(a, prompt_len, 0))
    decode = B * (2.0 * (a.body_params + a.head_params) * response_len + attention_flops(a, response_len, prompt_len))
    out = {"rollout: prefill": prefill, "rollout: decode": decode,
           "train: forward+backward": 3.0 * B * fwd_row}
    if kl:
        out["reference forward"] = B * fwd_row
    return out


def report(text: str, out: str | None) -> None:
    """Print a benchmark's markdown ``text`` and, with ``out``, write it there (its folders made)."""
    print(text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _times(fn, repeats: int, device: str = "cpu", inner: int = 1) -> list[float]:
    """Seconds of one call of ``fn``, ``repeats`` timings after one untimed call (``inner`` calls per
    timing, for short GPU kernels)."""
    fn()
    _sync(device)
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        _sync(device)
        ts.append((time.perf_counter() - t0) / inner)
    return ts


def _best_time(fn, repeats: int, device: str = "cpu", inner: int = 1) -> float:
    """The fewest seconds: a ceiling is the fastest the machine goes (a median let noise lower the rate
    and flatter every ratio against it: 12% apart between two idle runs)."""
    return min(_times(fn, repeats, device, inner))


def _median_time(fn, repeats: int, device: str = "cpu") -> float:
    """The median seconds: what a real pass achieves (the model timings)."""
    return statistics.median(_times(fn, repeats, device))


def matmul_rate(m: int, k: int, n: int, dtype: torch.dtype, repeats: int, device: str = "cpu") -> float:
    """FLOP/s of an [m, k] x [k, n] matmul on ``device``."""
    x, w = torch.randn(m, k, device=device).to(dtype), torch.randn(k, n, device=device).to(dtype)
    inner = 20 if device.startswith("cuda") else 1
    return 2.0 * m * k * n / _best_time(lambda: torch.mm(x, w), repeats, device, inner)


def copy_bandwidth(nbytes: int, repeats: int, device: str = "cpu") -> float:
    """Bytes/s read + written by a large tensor copy on ``device``."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    return 2.0 * nbytes / _best_time(lambda: dst.copy_(src), repeats, device)


MODEL_SHAPE = f"model [2048x{SMOLLM2_135M.hidden}]x[{SMOLLM2_135M.hidden}x{SMOLLM2_135M.mlp}]"


def measure(threads: int, repeats: int, size: int, device: str = "cpu") -> dict[str, float]:
    """Matmul rates (FLOP/s) and copy bandwidth (B/s); ``threads`` applies on CPU only."""
    torch.set_num_threads(threads)
    a = SMOLLM2_135M
    r = {}
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        r[f"{name} square {size}"] = matmul_rate(size, size, size, dt, repeats, device)
        r[f"{name} {MODEL_SHAPE}"] = matmul_rate(2048, a.hidden, a.mlp, dt, repeats, device)
    r["copy bandwidth"] = copy_bandwidth(512 << 20, repeats, device)
    return r


def model_step(rows: int, prompt_len: int, response_len: int, repeats: int, device: str = "cpu") -> list[dict]:
    """Measured forward(+backward) of the real model (the embedded default) on ``rows`` sequences of
    ``prompt_len + response_len`` tokens: what one training step's scoring costs, in four variants
    (fp32 / bf16 autocast; logits on the response positions only / on every position)."""
    from transformers import AutoModelForCausalLM

    from policyzoo.engine.models import resolve_model

    model = AutoModelForCausalLM.from_pretrained(str(resolve_model(None).path), dtype=torch.float32).to(device)
    model.eval()
    S = prompt_len + response_len
    ids = torch.randint(0, SMOLLM2_135M.vocab, (rows, S), generator=torch.Generator().manual_seed(0)).to(device)
    out = []
    for dtype in ("fp32", "bf16"):
        for keep in (response_len + 1, 0):  # 0 = logits at every position
            for backward in (False, True):
                def run():
                    with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=dtype == "bf16"):
                        logits = model(input_ids=ids, logits_to_keep=keep).logits
                        lp = torch.log_softmax(logits.float(), -1)[..., 0].sum()
                    if backward:
                        lp.backward()
                        model.zero_grad(set_to_none=True)
                if not backward:
                    run = torch.no_grad()(run)
                secs = _median_time(run, repeats, device)
                a = SMOLLM2_135M
                fwd = rows * (2.0 * a.body_params * S + 2.0 * a.head_params * (keep or S) + attention_flops(a, S, 0))
                f = fwd * (3 if backward else 1)
                out.append({"dtype": dtype, "logits": "response" if keep else "all", "backward": backward,
                            "seconds": secs, "gflop": f / 1e9, "gflops": f / secs / 1e9})
    return out


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--P", type=int, default=4, help="prompts per step")
    ap.add_argument("--G", type=int, default=8, help="samples per prompt")
    ap.add_argument("--prompt-len", type=int, default=None, help="prompt tokens per row (default: the median of "
                    "--metrics' prompt_tokens / rows, else 96)")
    ap.add_argument("--response-len", type=int, default=None, help="response tokens per row (default: the median "
                    "of --metrics' response_length_mean, else 64)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--size", type=int, default=1024, help="square matmul size")
    ap.add_argument("--no-kl", action="store_true", help="no reference forward (beta = 0)")
    ap.add_argument("--model-config", default=None, help="a config.json for another Llama-style model")
    ap.add_argument("--metrics", default=None, help="a run's metrics.jsonl: compare its measured time split")
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    ap.add_argument("--summary-key", default=None, help="with --metrics: record the run's training time over its "
                    "fp32 ceiling in bench/results/summary.json under this name (train_over_ceiling)")
    ap.add_argument("--model-step", action="store_true", help="also time the real model's forward/backward "
                    "(needs the embedded default model)")
    ap.add_argument("--model-rows", type=int, default=None, help="rows for --model-step (default P x G)")
    ap.add_argument("--model-repeats", type=int, default=None, help="timed runs per --model-step variant "
                    "(default --repeats)")
    a = ap.parse_args(argv)
    if a.metrics:
        why = unsupported_run(a.metrics)
        if why:
            ap.error(f"--metrics {a.metrics}: {why}")
    lengths = run_lengths(a.metrics) if a.metrics else {}
    if a.prompt_len is None:
        a.prompt_len = lengths.get("prompt_len", 96)
    if a.response_len is None:
        a.response_len = lengths.get("response_len", 64)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {a.device}: torch sees no GPU on this machine")
    if not (a.device == "cpu" or a.device.startswith("cuda")):
        ap.error("--device must be cpu or cuda[:N]")
    if min(a.P, a.G, a.prompt_len, a.response_len, a.repeats, a.size, *a.threads,
           *(v for v in (a.model_rows, a.model_repeats) if v is not None)) < 1:
        ap.error("every count must be >= 1")
    return a


def run_lengths(path: str) -> dict[str, int]:
    """Median prompt and response tokens per row of a run's training steps (its metrics.jsonl)."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    steps = [r for r in rows if r.get("rows") and "response_length_mean" in r]
    if not steps:
        return {}
    per_row = [r.get("prompt_tokens", 0) / (r.get("sampled_rows") or r["rows"]) for r in steps]
    return {"prompt_len": round(statistics.median(per_row)) or 96,
            "response_len": round(statistics.median(r["response_length_mean"] for r in steps))}


def unsupported_run(metrics_path: str) -> str | None:
    """Why a run cannot be set against this script's ceiling (a plain fp32 GRPO step), or None."""
    from pathlib import Path

    import yaml

    p = Path(metrics_path)
    if not p.is_file():
        return "no such file (a run's metrics.jsonl)"
    try:
        [json.loads(line) for line in p.open() if line.strip()]
    except ValueError:
        return "not a metrics.jsonl (one JSON object per line)"
    cfg_path = p.parent / "config.yaml"
    cfg = yaml.safe_load(cfg_path.read_text()) if cfg_path.exists() else {}
    algo = cfg.get("algorithm") or "grpo"  # `algorithm: grpo` or `{base: grpo, ...}`
    algo = algo if isinstance(algo, str) else algo.get("base", "grpo")
    options = [k for k, on in (("train.autocast", (cfg.get("train") or {}).get("autocast")),
                               ("train.gradient_checkpointing", (cfg.get("train") or {}).get("gradient_checkpointing")),
                               ("model.lora", (cfg.get("model") or {}).get("lora")),
                               ("engine.overlap", (cfg.get("engine") or {}).get("overlap") not in (None, "none")))
               if on]
    if algo != "grpo" or options:
        return (f"the ceiling counts a plain fp32 GRPO step; this run is {algo}"
                + (f" with {', '.join(options)}" if options else "") + ": compare it with `policyzoo plan --from-run`")
    return None


def run_config(metrics_path: str) -> str | None:
    """The run's own config.yaml (what its ``policyzoo train`` command set), next to its metrics."""
    from pathlib import Path

    p = Path(metrics_path).parent / "config.yaml"
    return p.read_text() if p.exists() else None


def measured_split(path: str) -> dict[str, float]:
    rows = [json.loads(line) for line in open(path) if line.strip()]
    keys = sorted({k for r in rows for k in r if k.startswith("time_")})
    return {k: statistics.median(float(r[k]) for r in rows if k in r) for k in keys}


def train_ceiling(res: dict, kind: str = "fp32") -> float:
    """Seconds of one step's training at the ``kind`` ceiling: forward+backward, the reference
    forward (when counted) and the optimizer."""
    c = res[f"ceiling_{kind}"]
    return c["train: forward+backward"] + c.get("reference forward", 0.0) + c["optimizer"]


def main(argv=None) -> dict:
    a = parse(argv)
    arch = arch_from_config(a.model_config) if a.model_config else SMOLLM2_135M
    print(f"torch {torch.__version__}; model {arch.params / 1e6:.1f}M parameters "
          f"(layers {arch.body_params / 1e6:.1f}M + head {arch.head_params / 1e6:.1f}M)\n")
    if a.device != "cpu":
        a.threads = a.threads[-1:]
    rates = {t: measure(t, a.repeats, a.size, a.device) for t in a.threads}
    print("| measured | " + " | ".join(f"{t} thread(s)" for t in a.threads) + " |")
    print("|---|" + "---|" * len(a.threads))
    for k in rates[a.threads[0]]:
        unit, scale = ("GB/s", 1e9) if "bandwidth" in k else ("GFLOP/s", 1e9)
        print(f"| {k} ({unit}) | " + " | ".join(f"{rates[t][k] / scale:.1f}" for t in a.threads) + " |")
    t = max(a.threads)
    fp32, bf16 = rates[t][f"fp32 {MODEL_SHAPE}"], rates[t][f"bf16 {MODEL_SHAPE}"]
    bw = rates[t]["copy bandwidth"]
    flops = step_flops(arch, a.P, a.G, a.prompt_len, a.response_len, kl=not a.no_kl, shared_prompt=True)
    wasted = step_flops(arch, a.P, a.G, a.prompt_len, a.response_len, kl=not a.no_kl, shared_prompt=True,
                        logits_everywhere=True)
    per_row = step_flops(arch, a.P, a.G, a.prompt_len, a.response_len, kl=not a.no_kl)
    print(f"\nOne GRPO step: P={a.P} x G={a.G}, prompt {a.prompt_len} + response {a.response_len} tokens, "
          f"{'with' if not a.no_kl else 'no'} reference forward, shared-prompt scoring; ceiling at {t} thread(s), "
          "model-shape matmul rate")
    print("| part | GFLOP | ceiling s, fp32 | ceiling s, bf16 | note |")
    print("|---|---|---|---|---|")
    res = {"rates": {str(k): v for k, v in rates.items()}, "flops": flops, "ceiling_fp32": {}, "ceiling_bf16": {}}
    for part, f in flops.items():
        c32, c16 = f / fp32, f / bf16
        note = ""
        if part == "rollout: decode":
            mem = a.response_len * arch.params * 4 / bw
            note = f"memory bound: {a.response_len} steps x {arch.params * 4 / 1e6:.0f} MB weights = {mem:.2f} s fp32"
            c32, c16 = max(c32, mem), max(c16, mem / 2)
        elif part.startswith("train") or part.startswith("reference"):
            note = (f"scoring each row in full (as TRL): {per_row[part] / 1e9:.0f} GFLOP; logits on every prompt "
                    f"position too: +{(wasted[part] - f) / 1e9:.0f} GFLOP")
        res["ceiling_fp32"][part], res["ceiling_bf16"][part] = c32, c16
        print(f"| {part} | {f / 1e9:.1f} | {c32:.2f} | {c16:.2f} | {note} |")
    # AdamW with fp32 master weights reads weights, gradients and both moments and writes weights and
    # moments: 7 passes over N x 4 bytes, whatever the model dtype; memory bound (no matmul FLOPs).
    opt = 7 * arch.params * 4 / bw
    res["ceiling_fp32"]["optimizer"], res["ceiling_bf16"]["optimizer"] = opt, opt
    print(f"| optimizer (AdamW) | 0 | {opt:.2f} | {opt:.2f} | memory bound: 7 x {arch.params * 4 / 1e6:.0f} MB "
          f"(weights, gradients, 2 moments read; weights, 2 moments written) |")
    tot32, tot16 = sum(res["ceiling_fp32"].values()), sum(res["ceiling_bf16"].values())
    print(f"| total | {sum(flops.values()) / 1e9:.1f} | {tot32:.2f} | {tot16:.2f} | |")
    if a.model_step:
        torch.set_num_threads(max(a.threads))
        rows, reps = a.model_rows or a.P * a.G, a.model_repeats or a.repeats
        print(f"\nThe model itself: forward (+ backward) on {rows} rows x {a.prompt_len} prompt + {a.response_len} "
              f"response tokens, {max(a.threads)} thread(s), median of {reps} after one untimed run")
        print("| dtype | logits on | pass | s | GFLOP | achieved GFLOP/s | of the fp32 matmul rate |")
        print("|---|---|---|---|---|---|---|")
        res["model_step"] = model_step(rows, a.prompt_len, a.response_len, reps, a.device)
        for r in res["model_step"]:
            print(f"| {r['dtype']} | {r['logits']} | {'fwd+bwd' if r['backward'] else 'fwd'} | {r['seconds']:.2f} | "
                  f"{r['gflop']:.0f} | {r['gflops']:.1f} | {r['gflops'] * 1e9 / fp32:.2f} |")
    if a.metrics:
        split = measured_split(a.metrics)
        print("\n| measured (median over the run) | s | x the fp32 ceiling |")
        print("|---|---|---|")
        ceil = {"time_rollout": res["ceiling_fp32"]["rollout: prefill"] + res["ceiling_fp32"]["rollout: decode"],
                "time_train": train_ceiling(res)}
        for k, v in split.items():
            print(f"| {k} | {v:.2f} | {v / ceil[k]:.1f} |" if k in ceil else f"| {k} | {v:.2f} | |")
        res["measured"] = split
        if "time_train" in split:
            res["train_over_ceiling"] = split["time_train"] / ceil["time_train"]
        if "time_rollout" in split:  # the rollout over its bound (decode: the weights read once per decode step)
            res["rollout_over_bound"] = split["time_rollout"] / ceil["time_rollout"]
        if a.summary_key and "time_train" in split:
            bf16 = (res["ceiling_bf16"]["train: forward+backward"] + res["ceiling_bf16"].get("reference forward", 0.0)
                    + res["ceiling_bf16"]["optimizer"])
            bench_summary.record(a.summary_key, round(split["time_train"] / ceil["time_train"], 2), argv,
                                 {"time_train_s": split["time_train"], "ceiling_fp32_s": ceil["time_train"],
                                  "over_bf16_ceiling": split["time_train"] / bf16, "metrics": a.metrics,
                                  "P": a.P, "G": a.G, "prompt_len": a.prompt_len, "response_len": a.response_len,
                                  "run_config": run_config(a.metrics)})
    elif a.summary_key:
        raise SystemExit("--summary-key needs --metrics (a run's metrics.jsonl to compare with the ceiling)")
    return res


if __name__ == "__main__":
    main()
