"""The doctor's parts, their timeouts and the tolerances each result is judged against.

Every part runs in its own process under ``timeout_s`` seconds (:mod:`policyzoo.doctor.runner`), so the
whole plan ends within the sum of its timeouts: :data:`FULL_BUDGET_S` (600 s, 10 minutes) for the full
plan, :data:`SUBSET_BUDGET_S` (480 s, 8 minutes) for the trainer subset. The tolerances are the
engine's own (:data:`policyzoo.engine.sync.SYNC_TOLERANCE`, the trainer's
``SHARE_PROMPT_TOLERANCE``): a GPU run passes when it stays inside what a training run accepts.

Pass or fail (:func:`judge`): a part's result is a dict of measurements, or ``{"error": why}`` (it raised,
exited non-zero or timed out), or ``{"skipped": why}`` (a module or GPUs it needs are missing: not a failure).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from policyzoo.engine.sync import SYNC_TOLERANCE
from policyzoo.engine.trainer.scoring import SHARE_PROMPT_TOLERANCE

FULL_BUDGET_S, SUBSET_BUDGET_S = 600, 480


@dataclass(frozen=True)
class Limit:
    """A measurement ``key`` of a part's result passes when it is a number ``<= limit`` (NaN and a
    missing value fail); ``source`` says where the tolerance comes from."""

    key: str
    limit: float
    source: str


@dataclass(frozen=True)
class Part:
    """One check. ``needs``: modules without which it is skipped (not failed); ``min_gpus``: the CUDA
    devices it needs (0: runs on CPU too); ``trainer``: part of the trainer subset; ``cpu_only``: left out
    of a plan on CUDA."""

    name: str
    timeout_s: int
    what: str
    limits: tuple[Limit, ...] = ()
    needs: tuple[str, ...] = ()
    min_gpus: int = 0
    trainer: bool = False
    cpu_only: bool = False


def _sync(dtype: str) -> Limit:
    return Limit("sync_max_diff", SYNC_TOLERANCE[dtype],
                 f"sync check, {dtype} (engine.sync_tolerance's default, nats)")


def _share(dtype: str) -> Limit:
    return Limit("share_prompt_max_diff", SHARE_PROMPT_TOLERANCE[dtype],
                 f"shared-prompt scoring vs per-row, {dtype} (nats)")


#: every step the train parts ran must have been an update: skipped steps (non-finite) fail
NOT_SKIPPED = Limit("skipped_steps", 0, "skipped (non-finite) updates")

FULL: tuple[Part, ...] = (
    Part("probe", 30, "versions, devices, bf16 support", trainer=True),
    Part("deepspeed_op", 150, "DeepSpeed's one CPU op compiled once, before any training (CPU only; ~90 s the "
         "first time, then cached; CUDA needs none)", trainer=True, cpu_only=True),
    Part("tiny_model", 30, "a tiny Llama (2 layers, hidden 128, byte tokenizer) built in place", trainer=True),
    Part("zero0_fp32", 75, "2 GRPO steps, ZeRO 0, fp32, transformers rollout, sync check: step time, memory",
         (_sync("float32"), _share("float32"), NOT_SKIPPED), trainer=True),
    Part("zero3_bf16", 75, "2 GRPO steps, ZeRO 3, bf16, transformers rollout: bf16 log-prob agreement "
         "(trainer vs transformers generate), step time, memory",
         (_sync("bfloat16"), _share("bfloat16"), NOT_SKIPPED), trainer=True),
    Part("ranks", 45, "one process per GPU (torchrun): each rank's device is cuda:LOCAL_RANK, NCCL all-reduce",
         (Limit("rank_device_mismatches", 0, "ranks not on cuda:LOCAL_RANK"),
          Limit("all_reduce_error", 0, "all-reduce of the ranks' numbers vs their sum")), min_gpus=2),
    Part("zero3_ranks", 120, "2 GRPO steps on every GPU (torchrun), ZeRO 3, bf16 (vLLM rollout where installed): "
         "ZeRO-3 gathers and the streamed push on ranks > 0", (_sync("bfloat16"), NOT_SKIPPED), min_gpus=2),
    Part("step_135m", 120, "2 GRPO steps of the default model's shape (random init, bf16, ZeRO 1; vLLM with "
         "engine.vllm_sleep=2 where installed): step time, memory per GPU, sleep/wake",
         (_sync("bfloat16"), _share("bfloat16"), NOT_SKIPPED), min_gpus=1),
    Part("trl_step", 90, "the same model shape, 2 steps of TRL's GRPOTrainer (transformers generate): step time, "
         "memory (a comparison, no tolerance)", needs=("trl", "datasets"), min_gpus=1),
)

SUBSET: tuple[Part, ...] = tuple(p for p in FULL if p.trainer)


def plan_for(trainer_only: bool, device: str = "cuda") -> tuple[Part, ...]:
    """The parts to run on ``device`` ("cuda" or "cpu"): the trainer subset, or the full plan."""
    return tuple(p for p in (SUBSET if trainer_only else FULL) if device == "cpu" or not p.cpu_only)


def budget_for(trainer_only: bool) -> int:
    """The time bound of a plan, seconds: 480 for the trainer subset, 600 for the full plan."""
    return SUBSET_BUDGET_S if trainer_only else FULL_BUDGET_S


def plan_text(parts: tuple[Part, ...], budget_s: int) -> str:
    """The plan as the dry run prints it: one line per part (timeout, needs) and the total bound."""
    lines = []
    for p in parts:
        need = [f"{p.min_gpus}+ GPUs"] if p.min_gpus else []
        need += [f"{m} installed" for m in p.needs]
        needs = f" [needs {', '.join(need)}]" if need else ""
        lines.append(f"  {p.name:<12} <= {p.timeout_s:>3} s  {p.what}{needs}")
        lines += [f"{'':19}pass: {lim.key} <= {lim.limit:g} ({lim.source})" for lim in p.limits]
    total = sum(p.timeout_s for p in parts)
    lines.append(f"total: at most {total} s (each part its own process and timeout; bound {budget_s} s)")
    return "\n".join(lines)


PASS, FAIL, ERROR, SKIPPED = "pass", "FAIL", "ERROR", "skipped"


@dataclass(frozen=True)
class Checked:
    """One tolerance applied: ``value`` (None: the part did not report it) against ``limit.limit``."""

    limit: Limit
    value: float | None

    @property
    def ok(self) -> bool:
        """True when ``value`` is a finite or infinite number ``<= limit`` (NaN and None fail)."""
        v = self.value
        return isinstance(v, (int, float)) and not math.isnan(v) and v <= self.limit.limit

    def text(self) -> str:
        """``"sync_max_diff 0.0021 <= 0.25 pass"``, ``"... 0.31 > 0.25 FAIL"``, ``"... missing FAIL"``."""
        if self.value is None:
            return f"{self.limit.key} missing {FAIL}"
        sign = "<=" if self.ok else ">"
        return f"{self.limit.key} {self.value:.4g} {sign} {self.limit.limit:g} {PASS if self.ok else FAIL}"


@dataclass(frozen=True)
class Verdict:
    """A part's status (:data:`PASS`, :data:`FAIL`, :data:`ERROR` or :data:`SKIPPED`), its checks and
    why it erred or was skipped."""

    part: Part
    status: str
    checks: tuple[Checked, ...] = ()
    reason: str = ""


def judge(part: Part, result: dict) -> Verdict:
    """Judge one part: an error stays an error, a skip a skip; else every limit must hold (a value
    the part did not report fails its limit)."""
    if "error" in result:
        return Verdict(part, ERROR, reason=str(result["error"]))
    if "skipped" in result:
        return Verdict(part, SKIPPED, reason=str(result["skipped"]))
    checks = tuple(Checked(lim, _number(result.get(lim.key))) for lim in part.limits)
    return Verdict(part, PASS if all(c.ok for c in checks) else FAIL, checks)


def _number(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def overall(verdicts: list[Verdict]) -> str:
    """:data:`PASS` when no part failed or erred (skipped parts do not count), else :data:`FAIL`."""
    return PASS if all(v.status in (PASS, SKIPPED) for v in verdicts) else FAIL
