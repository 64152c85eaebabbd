"""One command that checks the engine on a single GPU in at most 8 minutes (issue 20, item 8).

The check machine has torch, transformers, accelerate, peft and pytest, but no vLLM, DeepSpeed,
pydantic or network; what is missing comes in the travel bundle (``python bench/gpu_bundle.py``:
wheels of pydantic, pydantic-core, hjson, DeepSpeed and policyzoo, model configs and tokenizer files,
under 64 MiB)::

    pip install --no-index --find-links .build/gpu-bundle/wheels deepspeed policyzoo
    python bench/gpu_check.py --out bench/results/gpu_check
    python bench/gpu_check.py --dry-run       # on CPU (a test runs it): the plan and the bundle size

Each part runs in its own process under its own timeout and its result is appended to
``OUT/results.json`` as soon as it ends, so a part that hangs or crashes costs only itself:

* ``probe``: torch, CUDA, the GPU, versions of what was installed from the bundle;
* ``models``: random-init bf16 models from the shipped configs (the default SmolLM2-135M's shape and
  a 1.44B shape), saved with the bundle's tokenizer; forward/backward memory and time of each;
* ``zero1_bf16``, ``zero3_bf16``, ``fp32``, ``lora``: ``policyzoo train`` with the transformers rollout
  (no vLLM there) and DeepSpeed on CUDA with the sync check: 3 steps at ZeRO 1, 1 at ZeRO 3 (streamed
  sync), fp32 at ZeRO 0 for 1, LoRA for 2; step time, GPU memory and sync differences from metrics.jsonl;
* ``zero1_1b4``: 1 step of the 1.44B shape at ZeRO 1;
* ``hooks_large``: the step's loss hooks (GRPO) at B x T = 64 x 4096 on the GPU and on the host. In
  the engine the loss runs on the host today: the trainer hands log-probs to the step on the CPU.

Nothing here is a GPU number until it was run on a GPU; results are recorded with the command.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: (part, timeout in seconds): at most 480 s in all, no command over the machine's 600 s
PLAN = [("probe", 30), ("models", 60), ("zero1_bf16", 90), ("zero3_bf16", 60), ("fp32", 45), ("lora", 50),
        ("zero1_1b4", 90), ("hooks_large", 40)]
BUDGET_S, BUNDLE_MAX = 480, 64 * 2**20
CONFIGS = HERE / "gpu_models"
TRAIN = ["--algo", "grpo", "engine.rollout=transformers", "engine.sync_check=true", "train.prompts_per_step=4",
         "algorithm.sample.n=4", "algorithm.sample.max_tokens=32", "data.eval_size=4", "train.lr=1e-5",
         "data.limit=64"]
RUNS = {"zero1_bf16": ("smollm2-135m", ["model.dtype=bfloat16", "engine.zero_stage=1", "train.steps=3"]),
        "zero3_bf16": ("smollm2-135m", ["model.dtype=bfloat16", "engine.zero_stage=3", "train.steps=1"]),
        "fp32": ("smollm2-135m", ["model.dtype=float32", "engine.zero_stage=0", "train.steps=1"]),
        "lora": ("smollm2-135m", ["model.dtype=bfloat16", "engine.zero_stage=1", "train.steps=2",
                                  "model.lora={r: 8}"]),
        "zero1_1b4": ("llama-1.4b", ["model.dtype=bfloat16", "engine.zero_stage=1", "train.steps=1"])}


def _models_dir(out: Path) -> Path:
    return out / "models"


def part_probe(out: Path, bundle: Path) -> dict:
    import importlib.metadata as md

    import torch

    res = {"torch": torch.__version__, "cuda": torch.version.cuda, "available": torch.cuda.is_available()}
    if res["available"]:
        p = torch.cuda.get_device_properties(0)
        res.update(gpu=p.name, memory_gib=p.total_memory / 2**30, bf16=torch.cuda.is_bf16_supported())
    for d in ("transformers", "accelerate", "peft", "deepspeed", "pydantic", "policyzoo"):
        try:
            res[d] = md.version(d)
        except md.PackageNotFoundError:
            res[d] = None
    return res


def part_models(out: Path, bundle: Path) -> dict:
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    res = {}
    for cfg_file in sorted(CONFIGS.glob("*.json")):
        name, target = cfg_file.stem, _models_dir(out) / cfg_file.stem
        cfg = AutoConfig.for_model(**json.loads(cfg_file.read_text()))
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16).to(dev)
        model.save_pretrained(target, safe_serialization=True)
        for f in (bundle / "tokenizer").glob("*"):
            shutil.copy(f, target / f.name)
        x = torch.randint(0, cfg.vocab_size, (4, 512), device=dev)
        if dev == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        model(input_ids=x, labels=x).loss.backward()
        if dev == "cuda":
            torch.cuda.synchronize()
        res[name] = {"params": sum(p.numel() for p in model.parameters()), "fwd_bwd_4x512_s": time.perf_counter() - t0,
                     "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else None}
        del model
        if dev == "cuda":
            torch.cuda.empty_cache()
    return res


def part_train(out: Path, bundle: Path, name: str) -> dict:
    model, extra = RUNS[name]
    run_dir = out / "runs" / name
    cmd = [sys.executable, "-m", "policyzoo.cli", "train", "--output-dir", str(run_dir),
           f"model.path={_models_dir(out) / model}", *TRAIN, *extra]
    r = subprocess.run(cmd, capture_output=True, text=True)
    res = {"command": " ".join(cmd[1:]), "rc": r.returncode, "stderr_tail": r.stderr[-1500:] if r.returncode else ""}
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        keys = ("step", "time_step", "time_sync", "sync_max_diff", "sync_mean_diff", "gpu_peak_allocated_gib",
                "gpu_reserved_gib", "loss", "grad_norm", "skipped")
        res["steps"] = [{k: m.get(k) for k in keys} for m in map(json.loads, metrics.read_text().splitlines())
                        if m.get("kind") == "train"]
    summary = run_dir / "summary.json"
    if summary.is_file():
        s = json.loads(summary.read_text())
        res.update(share_prompt=s.get("share_prompt"), share_prompt_check=s.get("share_prompt_check"))
    return res


def part_hooks_large(out: Path, bundle: Path) -> dict:
    import torch

    from policyzoo import assemble
    from policyzoo.contract import Rollout, StepBatch
    from policyzoo.step import micro_loss, prepare, step_totals

    b, t = 64, 4096
    run = assemble({"base": "grpo"})
    res = {"B": b, "T": t}
    for dev in (["cuda"] if torch.cuda.is_available() else []) + ["cpu"]:
        g = torch.Generator().manual_seed(0)
        rand = lambda *shape: torch.rand(*shape, generator=g).to(dev)  # noqa: E731
        r = Rollout(prompt_ids=[[1, 2]] * b, response_ids=torch.randint(0, 100, (b, t), generator=g).to(dev),
                    response_mask=torch.ones(b, t, dtype=torch.bool, device=dev), rollout_logprobs=-rand(b, t),
                    group_ids=torch.arange(b // 8, device=dev).repeat_interleave(8),
                    truncated=torch.zeros(b, dtype=torch.bool, device=dev))
        try:  # every tensor on `dev`: a tensor the step makes on the CPU shows up here as an error
            batch, _ = prepare(run, StepBatch(r, rand(b), ref_logprobs=-rand(b, t)))
            lp = (-rand(b, t)).requires_grad_(True)
            t0 = time.perf_counter()
            loss, _ = micro_loss(run, batch, lp, step_totals(batch))
            loss.backward()
            if dev == "cuda":
                torch.cuda.synchronize()
            res[dev] = {"seconds": time.perf_counter() - t0, "loss": float(loss.detach())}
        except Exception as e:  # noqa: BLE001 - a finding to record, not a crash of the check
            res[dev] = {"error": f"{type(e).__name__}: {e}"[:500]}
    res["note"] = "the engine computes the loss on the host today (log-probs come back to the CPU)"
    return res


def bundle_size(bundle: Path) -> tuple[int, bool]:
    """Bytes of the bundle folder, or (when it is not built) an upper bound: the installed size of
    each distribution it carries (a wheel is compressed) plus the configs and tokenizer files."""
    if bundle.is_dir():
        return sum(f.stat().st_size for f in bundle.rglob("*") if f.is_file()), True
    import importlib.metadata as md

    total = sum(f.stat().st_size for f in CONFIGS.glob("*.json"))
    for d in ("pydantic", "pydantic_core", "hjson", "deepspeed", "policyzoo"):
        dist = md.distribution(d)
        total += sum(int(f.size or 0) for f in dist.files or [] if not str(f).endswith(".pyc"))
    return total + 4 * 2**20, False  # tokenizer files: ~3.5 MB for SmolLM2's


def dry_run(bundle: Path) -> int:
    total = sum(t for _, t in PLAN)
    size, built = bundle_size(bundle)
    ok = total <= BUDGET_S and all(t <= 600 for _, t in PLAN) and size < BUNDLE_MAX
    ok = ok and all(m in {p.stem for p in CONFIGS.glob("*.json")} for m, _ in RUNS.values())
    print(json.dumps({"plan": PLAN, "total_s": total, "budget_s": BUDGET_S, "bundle_bytes": size,
                      "bundle_built": built, "bundle_max": BUNDLE_MAX, "ok": ok}, indent=1))
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="check the plan and the bundle size (runs on CPU)")
    ap.add_argument("--bundle", type=Path, default=HERE.parent / ".build" / "gpu-bundle")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "gpu_check")
    ap.add_argument("--part", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.dry_run:
        return dry_run(args.bundle)
    if args.part:
        fn = RUNS.get(args.part) and (lambda o, b: part_train(o, b, args.part)) or globals()[f"part_{args.part}"]
        print("RESULT " + json.dumps(fn(args.out, args.bundle)), flush=True)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    results, path = {"command": " ".join(sys.argv), "plan": PLAN, "parts": {}}, args.out / "results.json"
    for part, timeout in PLAN:
        t0 = time.perf_counter()
        cmd = [sys.executable, __file__, "--part", part, "--out", str(args.out), "--bundle", str(args.bundle)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # its own group: a timeout ends the train run too
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
            line = next((x for x in stdout.splitlines() if x.startswith("RESULT ")), None)
            res = json.loads(line[7:]) if line else {"error": stderr[-2000:], "rc": proc.returncode}
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            res = {"error": f"timed out after {timeout} s"}
        res["wall_s"] = time.perf_counter() - t0
        results["parts"][part] = res
        path.write_text(json.dumps(results, indent=1))  # as it goes: a later hang loses nothing
        print(f"{part}: {'error' if 'error' in res else 'ok'} ({res['wall_s']:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
