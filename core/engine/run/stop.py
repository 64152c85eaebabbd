"""Why a run stops by itself, in words that name the real cause, and what it keeps.

The loop counts skipped updates in a row; at ``train.max_consecutive_skips`` the run stops with a
:class:`RunStopped` (a :class:`~policyzoo.errors.TrainingError`: exit 2). Two causes, told apart by
the skipped steps' ``skip_reason`` (:mod:`policyzoo.step.learn`):

* **nothing to train on**: the filters kept no rows (``no rows kept by the filters``), e.g. DAPO's
  dynamic sampling when every group's samples got the same reward (a collapsed policy samples the
  same answer G times; a task it always or never solves). No number is broken, so a lower
  ``train.lr`` or a NaN check does nothing; what acts is more signal: more sampling rounds
  (``train.max_sample_rounds``), a higher sampling temperature, an entropy bonus
  (``algorithm.term``), or clip-higher, which acts only from the second update on a batch
  (``train.updates_per_batch`` >= 2: the first ratio is exactly 1).
* **non-finite numbers**: a NaN/inf reward, log-prob, loss or gradient (``non-finite ...``); the
  fixes are the learning rate and the reward components.

Either way the work is kept: a skipped update writes nothing (``Trainer.step`` drops the gradients
without stepping the optimizer or its lr schedule; a step with no row kept never calls it, and the
stateful components are updated only after a real update), so the current weights are the last
good ones. :meth:`RunLoop.finish <policyzoo.engine.run.loop.RunLoop.finish>` checkpoints them (with
a save_pretrained export), runs the final held-out evaluation, writes ``summary.json`` with
``"stopped_early": true`` and ``"stop_reason"``, removes ``run.pid``, and then the error is raised.
"""

from __future__ import annotations

import math
from pathlib import Path

from policyzoo.errors import TrainingError

#: ``skip_reason`` of a step whose filters kept no row (``policyzoo.step.learn``), on one rank or several
NOTHING_KEPT = "no rows kept by the filters"
#: the filter reason of constant groups (``nonconstant_groups``: DAPO's dynamic sampling)
ZERO_STD = "zero_std_group"


class RunStopped(TrainingError):
    """The run stopped by itself at a step boundary, its work kept (exit 2). ``reason``: one line,
    ``summary.json``'s ``stop_reason``; ``cause``: ``nothing_to_train_on`` or ``non_finite``;
    ``metrics``: the record of the step it stopped at."""

    def __init__(self, where: str, why: str, fix: str, reason: str, cause: str, metrics: dict | None = None):
        super().__init__(where, why, fix)
        self.reason, self.cause, self.metrics = reason, cause, metrics or {}

    def kept(self, summary: dict, folder: Path, last_good: int, eval_name: str) -> None:
        """Complete the message (in place) with what the stopped run kept: the checkpoint ``folder`` (with
        its ``hf/`` export) of the last good weights (those of step ``last_good``: the skipped updates wrote
        nothing), the held-out value after (``summary``'s) and ``summary.json``; and how to continue."""
        acc = summary["eval_accuracy_after"]
        acc = f"{acc:.2f}" if isinstance(acc, float) and math.isfinite(acc) else "n/a (nothing held out)"
        weights = f"the weights of step {last_good}" if last_good > 0 else "the initial weights"
        run_dir = Path(summary["run_dir"])
        self.why = (f"{self.why}; kept: checkpoint of step {summary['steps']} in {folder}, with a save_pretrained "
                    f"export in {folder / 'hf'} (the skipped updates wrote nothing: these are {weights}, the last "
                    f"good ones); held-out {eval_name.removeprefix('held-out ')} after: {acc}; "
                    f"{run_dir / 'summary.json'} (stopped_early: true)")
        self.fix = (f"{self.fix}; then continue from that checkpoint with `policyzoo train --resume {run_dir}` (add "
                    "--force-resume after changing algorithm.* or rewards)")
        self.args = (self.render(),)


class SkipWatch:
    """Skipped updates in a row (their metrics records) and the entropy of the last step that trained;
    :meth:`update` returns the :class:`RunStopped` (:func:`skip_stop`) when the count reaches ``limit``,
    ``train.max_consecutive_skips`` of the ``train`` settings."""

    def __init__(self, train):
        self.limit, self.skipped = train.max_consecutive_skips, []
        self.entropy: tuple[int, float] | None = None

    @property
    def count(self) -> int:
        """Skipped updates in a row so far."""
        return len(self.skipped)

    def update(self, metrics: dict, step: int) -> RunStopped | None:
        """Book step ``step``'s merged record ``metrics`` (``skipped``, ``skip_reason``, ``entropy`` ...)."""
        if not metrics.get("skipped"):
            self.skipped = []
            if "entropy" in metrics:
                self.entropy = (step, float(metrics["entropy"]))
            return None
        self.skipped.append(metrics)
        return skip_stop(step, self.skipped, self.entropy) if self.count >= self.limit else None


def skip_stop(step: int, skipped: list[dict], entropy: tuple[int, float] | None = None) -> RunStopped:
    """The stop after ``skipped`` (the metrics records of the skipped steps in a row, the last one
    at step ``step``), naming its cause. ``entropy``: ``(step, nats per token)`` of the last step that
    trained (the policy's mean token entropy then), or None when none has."""
    n, last = len(skipped), skipped[-1]
    reason = str(last.get("skip_reason", "non-finite loss or gradient"))
    if reason.startswith(NOTHING_KEPT):
        return _nothing_kept(step, n, last, reason, entropy)
    return RunStopped(f"step {step}", f"{n} optimizer steps in a row were skipped (last reason: {reason}); no "
                      "weights were written by them", "lower train.lr, check the reward components for NaN/inf, or "
                      "raise train.max_consecutive_skips", f"{n} optimizer steps in a row skipped: {reason}",
                      "non_finite", last)


def _nothing_kept(step: int, n: int, last: dict, reason: str, entropy: tuple[int, float] | None) -> RunStopped:
    sampled, rounds = int(last.get("sampled_rows", 0)), int(last.get("sample_rounds", 1))
    dropped = {k.removeprefix("filtered/"): int(v) for k, v in last.items() if k.startswith("filtered/") and v}
    zero = dropped.pop(ZERO_STD, 0)
    frac = zero / sampled if sampled else 0.0
    where = reason.removeprefix(NOTHING_KEPT)  # " on rank 1" with several ranks
    facts = [f"of the {sampled} rows sampled in {rounds} round{'s' * (rounds != 1)}{where} at step {step}, the "
             f"filters kept none"]
    if zero:
        facts.append(f"{zero} ({frac:.0%}) were in zero-std groups: every sample of a prompt got the same reward, "
                     "so every advantage would be 0")
    facts += [f"{k}: {v} dropped" for k, v in sorted(dropped.items())]
    facts.append(f"policy entropy {entropy[1]:.3g} nats/token at step {entropy[0]}, the last step that trained"
                 if entropy else "no step has trained yet")
    why = (f"{n} step{'s' * (n != 1)} in a row had nothing to train on (no update, nothing wrong with the "
           f"numbers): {'; '.join(facts)}")
    if zero:
        fix = ("give the filter groups that differ: raise train.max_sample_rounds (dynamic sampling used "
               f"{rounds}), raise the sampling temperature (algorithm.sample.temperature), add an entropy bonus "
               "(algorithm.term=[{use: entropy, coef: 0.001}]) or use clip-higher (algorithm.clip.eps_high) with "
               "train.updates_per_batch >= 2; if every step's groups are constant, the reward may not tell answers "
               "apart at all (check it on a few completions) or the task may be too hard or too easy for the model "
               "(a lower train.lr does not help here)")
    else:
        fix = (f"loosen the filters that dropped the rows (algorithm.filter) or raise train.max_sample_rounds "
               f"(used {rounds})")
    ent = f", entropy {entropy[1]:.3g} at step {entropy[0]}" if entropy else ""
    lost = [f"zero-std groups: {zero}"] if zero else []
    lost += [f"{k}: {v}" for k, v in sorted(dropped.items())]
    short = (f"nothing to train on for {n} step{'s' * (n != 1)} in a row: the filters kept no rows "
             f"({', '.join(lost) or 'none dropped'} of {sampled} rows sampled in {rounds} "
             f"round{'s' * (rounds != 1)}{ent})")
    return RunStopped(f"step {step}", why, f"{fix}; or raise train.max_consecutive_skips", short,
                      "nothing_to_train_on", last)
