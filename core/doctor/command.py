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
    ``--device cuda`` finds no GPU (before the plan is printed; a dry run prints the plan with a note
    instead), and ``SystemExit(1)`` when a part failed or erred. ``--trainer-only`` implies ``--gpu``."""
    if not (args.gpu or args.trainer_only):
        raise UserError("policyzoo doctor", "no check chosen", "add --gpu (the only check so far), e.g. "
                        "policyzoo doctor --gpu --dry-run")
    problem = args.device == "cuda" and cuda_problem()
    if problem and not args.dry_run:
        raise UserError("policyzoo doctor --gpu", problem, "run it on the GPU node (make setup-cuda there), or "
                        "add --device cpu to run the trainer subset on CPU")
    trainer_only = args.trainer_only or args.device == "cpu"
    parts, budget = plan_for(trainer_only, args.device), budget_for(trainer_only)
    name = "the trainer subset" if trainer_only else "the full plan"
    print(f"policyzoo doctor --gpu: {name} on {args.device}, {len(parts)} parts; report: {args.out / 'report.md'}")
    print(plan_text(parts, budget))
    if args.dry_run:
        if problem:
            print(f"note: {problem} here; the plan above is for a CUDA node (--device cpu: the subset on CPU)")
        return
    verdicts = run_plan(parts, args.out, args.device, command_line(args), budget)
    result = overall(verdicts)
    print(f"{result}: report in {args.out / 'report.md'} (paste it into an issue)")
    if result != PASS:
        raise SystemExit(1)
