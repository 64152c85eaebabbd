"""``baseline`` components: rewards -> advantages ``[B, T]`` (0 on masked positions).

Conventions shared by the group baselines (``group_norm``, ``group_mean``, ``leave_one_out``):

* The score of row i is s_i = rewards_i + sum_t token_rewards_it (the KL penalty in reward
  placement enters here, as in RLOO / TRL's ``kl`` in reward).
* Rows are grouped by the explicit ``group_ids`` (never by position): shuffled rows and uneven
  group sizes give the same per-row advantages.
* A row with no trainable token or a NaN score is *invalid*: it enters no mean or std and gets
  advantage 0. A group with fewer than two valid rows gets 0 everywhere.
* Statistics are computed in float64 and cast back to the rewards' dtype.
* The per-row advantage is broadcast over the row's masked tokens.

``batch_whiten`` and ``gae`` work per token and whiten over the batch (G may be 1).

One module per family: :mod:`.group` (group baselines: group_norm, group_mean, leave_one_out,
reinforce_pp_baseline, opo, gpg), :mod:`.passk` (grpo_passk), :mod:`.multi` (gdpo, one
normalisation per reward component), :mod:`.greedy` (remax), :mod:`.token` (optimal_token_baseline,
tir_optimal_token_baseline: a baseline per token position), :mod:`.batch_whiten` (batch_whiten), :mod:`.critic`
(gae). The helpers they share (``valid_scores``, ``group_stats``, ``GroupBaseline``, ``reward_tokens``,
``token_returns``) are in the public contract (:mod:`policyzoo.contract.baselines`), for third-party baselines
too. Any baseline may be chained with batch whitening over the whole step (``whiten``;
:meth:`policyzoo.contract.Baseline.chain`).
"""

from policyzoo.plugins.baseline.batch_whiten import BatchWhiten
from policyzoo.plugins.baseline.critic import GAE
from policyzoo.plugins.baseline.greedy import ReMax
from policyzoo.plugins.baseline.group import GPG, OPO, GroupMean, GroupNorm, LeaveOneOut, ReinforcePPBaseline
from policyzoo.plugins.baseline.multi import GDPO
from policyzoo.plugins.baseline.passk import GRPOPassK
from policyzoo.plugins.baseline.token import OptimalTokenBaseline, TIROptimalTokenBaseline

COMPONENTS = (GroupNorm, GroupMean, LeaveOneOut, ReinforcePPBaseline, OPO, GPG, GRPOPassK, GDPO, ReMax,
              OptimalTokenBaseline, TIROptimalTokenBaseline, BatchWhiten, GAE)

__all__ = ["COMPONENTS", "GAE", "GDPO", "GPG", "OPO", "BatchWhiten", "GRPOPassK", "GroupMean", "GroupNorm",
           "LeaveOneOut", "OptimalTokenBaseline", "ReMax", "ReinforcePPBaseline", "TIROptimalTokenBaseline"]
