"""User-facing errors: one block that says where, why and how to fix it.

Every mistake a user can make in a config, a plugin or a data file raises a subclass of
:class:`UserError`. The CLI prints ``str(error)`` and exits with status 2, without a stack trace.
"""

from __future__ import annotations

import difflib
import signal


class UserError(Exception):
    """A mistake the user can fix. Printed as one block: ``where``, ``why`` and ``fix``."""

    def __init__(self, where: str, why: str, fix: str = ""):
        self.where, self.why, self.fix = where, why, fix
        super().__init__(self.render())

    def render(self) -> str:
        lines = [f"error at {self.where}:", f"  {self.why}"]
        if self.fix:
            lines.append(f"  fix: {self.fix}")
        return "\n".join(lines)


class ConfigError(UserError):
    """A config value, key, component name or slot combination is wrong."""


class PluginError(UserError):
    """A plugin distribution failed to load, or registered a name that is already taken."""


class ComponentError(UserError):
    """A component raised while the step called it (the cause is chained)."""


class DataError(UserError):
    """A data file, column or row is unusable."""


class TrainingError(UserError):
    """The run cannot go on (e.g. too many non-finite updates in a row)."""


class Interrupted(UserError):
    """The run was stopped by a signal: Ctrl-C (SIGINT) or SIGTERM (``signum``), after saving a
    checkpoint, or at start-up with nothing to save (``why`` says which). The CLI exits with
    :attr:`exit_code`, 128 + ``signum`` as the shells report a process a signal ended (130 for SIGINT,
    143 for SIGTERM), not 2. Printed as ``stopped at WHERE:``, ``WHY`` and ``to continue: FIX`` (the
    resume command): it is no error."""

    def __init__(self, where: str, why: str, fix: str = "", signum: int = signal.SIGINT):
        self.signum = int(signum)
        super().__init__(where, why, fix)

    @property
    def exit_code(self) -> int:
        """128 + the signal's number: 130 for SIGINT, 143 for SIGTERM."""
        return 128 + self.signum

    def render(self) -> str:
        lines = [f"stopped at {self.where}:", f"  {self.why}"]
        if self.fix:
            lines.append(f"  to continue: {self.fix}")
        return "\n".join(lines)


def edit_distance(a: str, b: str) -> int:
    """The optimal string alignment distance: insertions, deletions, substitutions and swaps of two
    neighbouring characters, each 1 (``bse`` -> ``base``: 1; ``gpro`` -> ``grpo``: 1)."""
    prev2, prev = None, list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], prev2[j - 2] + 1)
        prev2, prev = prev, row
    return prev[-1]


def did_you_mean(name: str, choices) -> str:
    """Return ``" (did you mean 'x'?)"`` for up to three close choices, or ``""``. Close: difflib's similarity >= 0.5,
    or an edit distance (:func:`edit_distance`) of at most a third of the name's length. Ranked by
    edit distance, then choices the name begins, then difflib's similarity, keeping those within one edit of the
    closest: ``bse`` gives ``base`` (distance 1), not ``baseline`` (5). Case is ignored (``GRPO`` finds ``grpo``)."""
    by_lower = {str(c).lower(): str(c) for c in sorted(map(str, choices))}  # GRPO -> grpo too
    key = str(name).lower()
    close = set(difflib.get_close_matches(key, list(by_lower), n=len(by_lower) or 1, cutoff=0.5))
    close |= {c for c in by_lower if edit_distance(key, c) <= len(key) // 3}
    ranked = sorted(close, key=lambda c: (edit_distance(key, c), not c.startswith(key),
                                          -difflib.SequenceMatcher(None, key, c).ratio(), c))
    if not ranked:
        return ""
    best = edit_distance(key, ranked[0])
    ranked = [c for c in ranked if edit_distance(key, c) <= best + 1]  # a far guess beside a near one is noise
    return " (did you mean " + " or ".join(repr(by_lower[c]) for c in ranked[:3]) + "?)"
