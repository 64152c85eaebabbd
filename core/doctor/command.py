"""``policyzoo doctor --gpu``: print the plan, or run it and write the report."""

from __future__ import annotations

import shlex

from policyzoo.errors import UserError

from .plan import budget_for, plan_for, plan_text
from .runner import run_plan
from .verdict import PASS, overall


def command_line(args) -> str:
    """The command as a user types it, for the report."""
    words = ["policyzoo", "doctor", "--gpu"] + (["--trainer-only"] if args.trainer_only else [])
    words += ["--device", args.device] if args.device != "cuda" else []
    return shlex.join(words + ["--out", str(args.out)])


def cuda_problem() -> str | None:
    """Why the parts would see no CUDA GPU here, or None."""
    import torch

    if torch.cuda.is_available():
        return None
    built = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    return f"torch {torch.__version__} ({built}) sees no CUDA GPU"


def cmd_doctor(args, out) -> None:
    """Run (or with ``--dry-run`` print) the plan; raises :class:`UserError` without ``--gpu`` or when
    ``--device cuda`` finds no GPU, and ``SystemExit(1)`` when a part failed or erred."""
    if not args.gpu:
        raise UserError("policyzoo doctor", "no check chosen", "add --gpu (the only check so far), e.g. "
                        "policyzoo doctor --gpu --dry-run")
    trainer_only = args.trainer_only or args.device == "cpu"
    parts, budget = plan_for(trainer_only, args.device), budget_for(trainer_only)
    name = "the trainer subset" if trainer_only else "the full plan"
    print(f"policyzoo doctor --gpu: {name} on {args.device}, {len(parts)} parts; report: {args.out / 'report.md'}")
    print(plan_text(parts, budget))
    if args.dry_run:
        return
    problem = args.device == "cuda" and cuda_problem()
    if problem:
        raise UserError("policyzoo doctor --gpu", problem, "run it on the GPU node (make setup-cuda there), or "
                        "add --device cpu to run the trainer subset on CPU")
    verdicts = run_plan(parts, args.out, args.device, command_line(args), budget)
    result = overall(verdicts)
    print(f"{result}: report in {args.out / 'report.md'} (paste it into an issue)")
    if result != PASS:
        raise SystemExit(1)
