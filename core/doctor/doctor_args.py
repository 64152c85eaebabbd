"""``policyzoo doctor``'s arguments (registered by :mod:`policyzoo.cli`; light: argparse only, so that
``policyzoo --help`` loads no torch). The command itself: :mod:`policyzoo.doctor.runner`."""

from __future__ import annotations

import argparse
from pathlib import Path

EPILOG = """exit status: 0 when every part passed or was skipped, 1 when one failed or erred, 2 on a usage error.
The report (OUT/report.md) is meant to be pasted into an issue; OUT/results.json holds the raw results."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``--gpu``, ``--trainer-only``, ``--device``, ``--out``, ``--dry-run`` on ``p``."""
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EPILOG
    p.add_argument("--gpu", action="store_true", help="the GPU checks: devices per rank, ZeRO-3 gathers, sleep/wake "
                   "memory (with vLLM), bf16 sync differences against their tolerances, step time, memory per GPU, "
                   "the same step with TRL (when installed); each part its own process and timeout, <= 10 minutes")
    p.add_argument("--trainer-only", action="store_true", help="only the trainer subset (torch, transformers, "
                   "DeepSpeed and policyzoo: what `make gpu-bundle` carries; no vLLM), <= 8 minutes")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: the trainer subset on CPU "
                   "(no GPU made visible to the parts)")
    p.add_argument("--out", type=Path, default=Path("policyzoo-doctor"), help="folder of report.md, results.json, "
                   "the built models and runs (default ./policyzoo-doctor)")
    p.add_argument("--dry-run", action="store_true", help="print the parts, their timeouts and tolerances, "
                   "and the time bound; run nothing")
