"""Pass or fail: a part's result judged against its tolerances (:class:`policyzoo.doctor.plan.Limit`).

A part's result is a dict of measurements, or ``{"error": why}`` (it raised, exited non-zero or timed
out), or ``{"skipped": why}`` (a module or GPUs it needs are missing: not a failure).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .plan import Limit, Part

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
