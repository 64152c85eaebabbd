"""Which algorithms are the same at a run's settings: a gradient probe, before anything runs.

With one optimizer step per sampled batch (``train.updates_per_batch: 1``, no stale batches) every
ratio is exactly 1, so no clip and no ratio acts: ``grpo`` and ``grpo+clip=cispo`` make the same
update (at r = 1, PPO's clip gives the gradient -A grad log pi, CISPO's -sg(min(r, eps_max)) A
grad log pi = -A grad log pi), and a compare of the two measures noise. The probe finds this from
the step's own code: for each algorithm it computes the gradient of the loss with respect to the
log-probs, d(loss)/d(logprobs) ``[B, T]`` (and d(loss)/d(entropy) when a ``term`` reads the entropy),
through :func:`policyzoo.step.prepare` (``kl`` in reward placement, ``baseline``) and
:func:`policyzoo.step.micro_loss` (``ratio``, ``clip``, ``kl`` in loss placement, ``term``, ``reduce``)
on a few synthetic batches that follow the run's regime (:class:`Regime`, :func:`probe_batches`);
the ``filter`` components are asked which rows they keep on the same batches. Two algorithms are
*equal* when every batch keeps the same rows and the gradients agree to :data:`RTOL` (relative to
the larger gradient's largest entry). Slots that cannot be probed on synthetic batches (``sample``,
``reward``, ``env``) and components that keep state across steps must be the same for a claim.

* :func:`equal_entries`: ``policyzoo compare`` refuses entries that are equal (unless ``--allow-equal``);
* :func:`run_warnings`: ``train --dry-run``, the run's start-up warnings and ``explain``: the run equals
  its zoo base, or one slot's component is an identity at these settings (a clip at ratio 1, a KL at
  beta 0, a filter that cannot drop, a term with coefficient 0).

A probe that fails on a component (a third-party component that refuses synthetic data) claims
nothing and says so in one line; it never stops a run. The only errors raised are ``equal_entries``'s
:class:`~policyzoo.errors.ConfigError` for equal entries and the :class:`~policyzoo.errors.DataError` of data
that does not load (the run would stop on it too); :func:`equal_pairs` gives the pairs (the table of runs
already made names them). Imports: contract, step and the building of
a run only (no engine): about 0.1 s for two entries on a CPU (B = P x G rows, T <= 8 tokens, float64).

Peers: verl splits a batch into several optimizer steps (``ppo_mini_batch_size``), so its ratios move
from the second mini-batch on; here each optimizer step takes the whole batch, and only
``train.updates_per_batch`` > 1 or stale batches move them. Sources: PPO's
clipped surrogate at r = 1 (Schulman et al. 2017, arXiv:1707.06347, eq. 7), CISPO (MiniMax-M1,
arXiv:2506.13585, eq. 4), GSPO's sequence ratio (arXiv:2507.18071, eq. 7).
"""

from .batches import ProbeBatch, Regime, probe_batches, regime, task_reward_classes
from .gradient import ATOL, RTOL, Probe, gradient, probe, same
from .verdict import NEUTRAL, equal_entries, equal_pairs, inert_slots, notes_and_warnings, probe_failure, run_warnings

__all__ = ["ATOL", "NEUTRAL", "RTOL", "Probe", "ProbeBatch", "Regime", "equal_entries", "equal_pairs", "gradient",
           "inert_slots", "notes_and_warnings", "probe", "probe_batches", "probe_failure", "regime", "run_warnings",
           "same", "task_reward_classes"]
