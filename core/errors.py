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


def did_you_mean(name: str, choices) -> str:
    """Return ``" (did you mean 'x'?)"`` for the closest choices, or ``""``."""
    by_lower = {str(c).lower(): str(c) for c in sorted(map(str, choices))}  # GRPO -> grpo too
    close = [by_lower[c] for c in difflib.get_close_matches(str(name).lower(), list(by_lower), n=3, cutoff=0.5)]
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(c) for c in close) + "?)"
