"""Peak memory of the weight sync at ZeRO 3 on 2 CPU ranks: streamed (one parameter gathered at a
time) / whole model gathered at once, recorded as ``sync_memory_ratio`` in bench/results/summary.json.

    python bench/sync_memory.py            # launches torchrun twice (2 ranks each), one mode per launch

Each launch builds a randomly initialised fp32 model of the default model's shape (SmolLM2-135M:
``policyzoo.plan.DEFAULT_CONFIG``, 135M parameters, 0.54 GB in fp32), wraps it in a ZeRO-3 DeepSpeed
engine (each rank holds half of it) and pushes its weights through ``Trainer.full_weights`` into a
preallocated copy (as vLLM copies into its own tensors). A thread samples the resident memory every
millisecond during the push; the number is the peak above the level just before it, max over the
two ranks. One mode per launch, so memory the C heap keeps from one mode never hides the other's.
Memory does not depend on the machine's load (timings would); the number is taken on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(mode: str) -> None:
    from policyzoo.engine.process import setup_process

    setup_process(threads=1)
    import psutil
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from policyzoo.engine import dist
    from policyzoo.engine.run.startup import trim_heap
    from policyzoo.engine.trainer.checkpoint_io import TrainerIO
    from policyzoo.engine.trainer.dsconfig import ds_config, initialize
    from policyzoo.plan import DEFAULT_CONFIG

    dist.init()
    torch.manual_seed(0)
    cfg = {k: v for k, v in DEFAULT_CONFIG.items() if k != "model_type"}
    model = LlamaForCausalLM(LlamaConfig(**cfg, torch_dtype="float32"))
    # the receiving engine's tensors, written once so that their pages are resident before the baseline
    target = {n: torch.empty_like(p).fill_(1.0) for n, p in model.named_parameters()}
    io = TrainerIO()
    io.lora, io.stage = False, 3
    io.engine = initialize(model, list(model.parameters()), ds_config(3, 1e-5, 0.0, 1.0, "float32"), None)
    trim_heap()
    proc, peak, stop = psutil.Process(), [0], threading.Event()
    base = proc.memory_info().rss

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.001)
    th = threading.Thread(target=sample, daemon=True)
    th.start()
    t0 = time.perf_counter()
    with torch.no_grad(), io.full_weights(streamed=mode == "streamed") as weights:
        for name, t in weights:
            target[name].copy_(t)
            peak[0] = max(peak[0], proc.memory_info().rss)
    seconds = time.perf_counter() - t0
    stop.set()
    th.join()
    checksum = float(sum(t.double().sum() for t in target.values()))
    out = dist.gather({"peak_gib": (peak[0] - base) / 2**30, "seconds": seconds, "checksum": checksum})
    if dist.rank() == 0:
        print("RESULT " + json.dumps(out), flush=True)


def launch(mode: str) -> list[dict]:
    from policyzoo.engine.process import free_port

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
           __file__, "--worker", mode]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.setdefault("POLICYZOO_CACHE", str(ROOT / ".build" / "cache"))
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200, cwd=ROOT)
    if r.returncode:
        sys.exit(r.stderr[-4000:])
    return json.loads(next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))[7:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", choices=["whole", "streamed"], help=argparse.SUPPRESS)
    ap.add_argument("--no-record", action="store_true", help="print only; leave bench/results/summary.json")
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker)
    sys.path.insert(0, str(Path(__file__).parent))
    from summary import record

    res = {mode: launch(mode) for mode in ("whole", "streamed")}
    assert res["whole"][0]["checksum"] == res["streamed"][0]["checksum"], "the two syncs pushed other weights"
    whole = max(r["peak_gib"] for r in res["whole"])
    streamed = max(r["peak_gib"] for r in res["streamed"])
    detail = {"peak_gib_whole": whole, "peak_gib_streamed": streamed, "ranks": 2, "zero_stage": 3,
              "model": "SmolLM2-135M shape, random init, fp32 (134.5M parameters, 0.50 GiB)",
              "per_rank": res, "what": "resident memory above the level before the sync, max over ranks; the "
              "receiving copy preallocated; seconds are not comparable (machine shared)"}
    print(json.dumps(detail, indent=1))
    if not args.no_record:
        record("sync_memory_ratio", round(streamed / whole, 3), detail=detail)


if __name__ == "__main__":
    main()
