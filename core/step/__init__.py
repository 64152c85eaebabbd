"""policyzoo.step: the algorithm-free training step, one phase a module, in run order.

1. :mod:`.collect`: the step's settings and seeds, sampling rounds, rewards and filters
   (``sample`` -> ``reward`` -> ``filter``);
2. :mod:`.advantages`: per-token rewards and advantages (``kl`` in reward placement, ``baseline``);
3. :mod:`.loss`: the loss of one micro-batch (``ratio`` -> ``clip`` -> the additive terms: ``kl`` in
   loss placement, then ``term`` -> ``reduce``) and the step's normalisers;
4. :mod:`.learn`: :func:`train_step` = collect + :func:`learn` (score, advantages, update, sync).

Beside them, :mod:`.dispatch` calls the hooks (step -> pluggy -> component -> :mod:`.boundary`'s
check of the result -> step) and :mod:`.episodes` runs multi-turn episodes token-exact. This package
imports only :mod:`policyzoo.contract` and :mod:`policyzoo.errors`; the real engine and the bandit
test bed both run it unchanged.
"""

from .advantages import masked_mean, prepare
from .collect import SEED_STRIDE, ShortfallError, StepSettings, collect, round_seed, step_seed
from .learn import learn, needs_reference, train_step
from .loss import loss_terms, micro_loss, step_totals

__all__ = ["SEED_STRIDE", "ShortfallError", "StepSettings", "collect", "learn", "loss_terms", "masked_mean",
           "micro_loss", "needs_reference", "prepare", "round_seed", "step_seed", "step_totals", "train_step"]
