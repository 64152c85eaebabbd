"""Numeric agreement with TRL: loss and gradient w.r.t. the log-probs on identical tensors.

For each bundle with a TRL counterpart (grpo, dapo, dr_grpo, gspo, cispo, luspo), the ``vespo`` clip
and the KL times the ratio (``kl: {times_ratio: true}``, TRL's ``use_bias_correction_kl``) this computes

* ours:  rewards -> ``policyzoo.step.prepare`` (the bundle's baseline) -> ``micro_loss``;
* TRL's: rewards -> TRL's advantage formula -> ``GRPOTrainer._compute_loss``, TRL's own loss code,
  called on a stand-in ``self`` (:class:`TRLStandIn`) whose attributes are set from a real
  ``GRPOConfig`` exactly as ``GRPOTrainer.__init__`` sets them, and whose per-token log-prob
  function returns our leaf tensor instead of running a model.

TRL computes advantages inside ``_generate_and_score_completions`` (which also generates), so
that part cannot be called alone; :func:`trl_advantages` restates it (TRL 1.16.0,
trl/trainer/grpo_trainer.py, "sum_then_normalize" branch) using TRL's own ``nanstd``:
A = (r - mean_g) / (nanstd_g + 1e-4) with groups = consecutive blocks of G rows
(``scale_rewards="group"``), or A = r - mean_g (``"none"``). TRL's ``nanstd`` computes Bessel's
factor count/(count-1) from integer counts in float32 (4/3 -> 1.33333337), so its std carries a
relative error of ~1.5e-8 even in float64: "equal" below means within 1e-7 relative.

Every case states the convention that separates the two and the setting that makes them agree.
Run: ``python bench/trl_agreement.py`` (needs ``pip install -e .[bench]``); prints a markdown table.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch

import policyzoo
from policyzoo.contract import Rollout, StepBatch
from policyzoo.step import micro_loss, prepare, step_totals

G, T = 4, 6
LENGTHS = (6, 3, 1, 5, 2, 6, 4, 3)  # ragged, two prompts x G = 4
REWARDS = (1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0)
EMPTY_ROW = (6, 3, 1, 5, 2, 6, 4, 0)  # the last row has no trainable token
UNEVEN = (6, 6, 6, 6, 1, 1, 2, 1)  # two micro-batches of 4 rows: 24 and 5 tokens
#: (label, our spec, TRL kwargs, convention) under 2 micro-batches (gradient accumulation), same advantages
MICRO_CASES = [
    ("grpo, 2 micro-batches of 4 rows (24 / 5 tokens)", {"base": "grpo", "baseline": {"eps": 1e-4}},
     dict(loss_type="grpo", beta=0.04, use_bias_correction_kl=False),
     "exact in both: TRL divides each micro-batch's row mean by the accumulation steps (equal row counts here)"),
    ("dapo, 2 micro-batches (24 / 5 tokens)", {"base": "dapo", "baseline": {"eps": 1e-4}, "reward": [], "filter": []},
     dict(loss_type="dapo", epsilon=0.2, epsilon_high=0.28, beta=0.0),
     "exact in both: TRL divides by the step's num_items_in_batch, ours by StepTotals.tokens"),
    ("TRL 'bnpo' vs ours token_mean, 2 micro-batches (24 / 5 tokens)",
     {"base": "dapo", "baseline": {"eps": 1e-4}, "reward": [], "filter": []},
     dict(loss_type="bnpo", epsilon=0.2, epsilon_high=0.28, beta=0.0),
     "TRL 'bnpo' averages each micro-batch's token mean (1/2 (S1/24 + S2/5)); ours (S1 + S2)/29 for any split"),
]


@dataclass
class Case:
    """Identical inputs for both sides. Shapes ``[B, T]`` float64 except ``mask`` (bool) and
    ``rewards [B]``. ``logprobs`` is re-made a fresh leaf by each side."""

    logprobs: torch.Tensor
    old: torch.Tensor
    ref: torch.Tensor
    mask: torch.Tensor
    rewards: torch.Tensor
    group_ids: torch.Tensor = field(default=None)


def make_case(seed: int = 0, lengths=LENGTHS, rewards=REWARDS, drift: float = 0.3) -> Case:
    """A ragged off-policy batch: |logprobs - old| ~ drift so both clip sides are hit."""
    g = torch.Generator().manual_seed(seed)
    b = len(lengths)
    mask = torch.arange(T).expand(b, T) < torch.tensor(lengths).unsqueeze(-1)
    logprobs = -torch.rand(b, T, generator=g, dtype=torch.float64) * 3 - 0.05
    old = logprobs + drift * torch.randn(b, T, generator=g, dtype=torch.float64)
    ref = logprobs + 0.2 * torch.randn(b, T, generator=g, dtype=torch.float64)
    gids = torch.arange(b) // G
    return Case(logprobs, old, ref, mask, torch.tensor(rewards, dtype=torch.float64), gids)


# ----------------------------------------------------------------------------- ours
def ours(spec, case: Case) -> tuple[float, torch.Tensor, torch.Tensor]:
    """(loss, d loss / d logprobs [B, T], advantages [B]) through the hooks."""
    run = policyzoo.assemble(spec)
    b = len(case.rewards)
    rollout = Rollout(prompt_ids=[[1]] * b, response_ids=torch.ones(b, T, dtype=torch.long),
                      response_mask=case.mask.clone(), rollout_logprobs=case.old.clone(),
                      group_ids=case.group_ids.clone(), truncated=torch.zeros(b, dtype=torch.bool))
    batch = StepBatch(rollout, case.rewards.clone(), old_logprobs=case.old.clone(),
                      ref_logprobs=case.ref.clone() if run.kl is not None else None)
    batch, _ = prepare(run, batch)
    lp = case.logprobs.clone().requires_grad_(True)
    loss, _ = micro_loss(run, batch, lp, step_totals(batch))
    loss.backward()
    adv_row = (batch.advantages * case.mask).sum(-1) / case.mask.sum(-1).clamp(min=1)
    return float(loss.detach()), lp.grad.detach(), adv_row.detach()


# ----------------------------------------------------------------------------- TRL
def trl_advantages(rewards: torch.Tensor, num_generations: int, scale_rewards: str = "group") -> torch.Tensor:
    """TRL 1.16.0's GRPO advantages (see the module docstring), ``[B]``."""
    from trl.trainer.utils import nanstd

    grouped = rewards.view(-1, num_generations)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(num_generations)
    adv = rewards - mean
    if scale_rewards == "group":
        std = nanstd(grouped, dim=1).repeat_interleave(num_generations)
        adv = adv / (std + 1e-4)
    elif scale_rewards == "batch":  # one std over every reward of the batch
        adv = adv / (nanstd(rewards).expand_as(rewards) + 1e-4)
    elif scale_rewards != "none":
        raise ValueError(f"scale_rewards={scale_rewards!r} is not compared here")
    return adv


def trl_normalize_then_sum(rewards_per_func: torch.Tensor, weights: torch.Tensor, num_generations: int) -> torch.Tensor:
    """TRL 1.16.0's ``multi_objective_aggregation="normalize_then_sum"`` advantages ``[B]`` from
    ``rewards_per_func [B, K]``: each function normalised in its group (nanmean, ``nanstd`` + 1e-4),
    the weighted ``nansum``, NaN where every function is NaN, then (x - nanmean) / (nanstd + 1e-4)
    over the batch, NaN -> 0 (grpo_trainer.py, the "normalize_then_sum" branch, restated)."""
    from trl.trainer.utils import nanstd

    k = rewards_per_func.shape[1]
    grouped = rewards_per_func.view(-1, num_generations, k)
    mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
    std_k = nanstd(grouped, dim=1, keepdim=True)
    reward_k = ((grouped - mean_k) / (std_k + 1e-4)).view(-1, k)
    rewards = (reward_k * weights.unsqueeze(0)).nansum(dim=1)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    adv = (rewards - torch.nanmean(rewards)) / (nanstd(rewards).expand_as(rewards) + 1e-4)
    return torch.nan_to_num(adv, nan=0.0)


class _Accelerator:
    """One process: gather/reduce are the identity."""

    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x


class _Model:
    training = True


class TRLStandIn:
    """The attributes ``GRPOTrainer._compute_loss`` reads, set from ``args`` (a ``GRPOConfig``) the way
    ``GRPOTrainer.__init__`` sets them (TRL 1.16.0). ``_get_per_token_logps_and_entropies`` returns
    the leaf ``logprobs`` it was given (entropies 0) instead of running a model."""

    def __init__(self, args, logprobs: torch.Tensor):
        from trl import GRPOTrainer

        self.args = args
        self.loss_type = args.loss_type
        self.beta = args.beta
        self.epsilon_low = args.epsilon
        self.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
        self.importance_sampling_level = args.importance_sampling_level
        self.off_policy_mask_threshold = args.off_policy_mask_threshold
        self.top_entropy_quantile = args.top_entropy_quantile
        self.use_vllm = args.use_vllm
        self.vllm_importance_sampling_correction = args.vllm_importance_sampling_correction
        self.max_completion_length = args.max_completion_length
        self.entropy_coef = args.entropy_coef
        self.use_adaptive_entropy = args.use_adaptive_entropy
        self._entropy_bonus_enabled = self.entropy_coef != 0.0 or self.use_adaptive_entropy
        self.aux_loss_enabled = False
        self.current_gradient_accumulation_steps = args.gradient_accumulation_steps
        self.accelerator = _Accelerator()
        self.model = _Model()
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        self._logprobs = logprobs
        self.get_off_policy_mask = GRPOTrainer.get_off_policy_mask
        self.get_gamma_weights = GRPOTrainer.get_gamma_weights
        self.get_high_entropy_mask = getattr(GRPOTrainer, "get_high_entropy_mask", None)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, **kw):
        assert logits_to_keep == self._logprobs.shape[1]
        return self._logprobs, torch.zeros_like(self._logprobs.detach()), None


def trl_config(**kw):
    """A ``GRPOConfig`` on CPU, nothing logged; ``max_completion_length`` defaults to T."""
    from trl import GRPOConfig

    kw.setdefault("max_completion_length", T)
    return GRPOConfig(output_dir="/tmp/policyzoo-trl-agreement", use_cpu=True, report_to=[], **kw)


def trl(config_kw: dict, case: Case, scale_rewards: str | None = None,
        advantages: torch.Tensor | None = None) -> tuple[float, torch.Tensor, torch.Tensor]:
    """(loss, d loss / d logprobs [B, T], advantages [B]) from TRL's own ``_compute_loss``.
    ``advantages [B]`` given: used as they are (to isolate the loss from the advantage formula)."""
    from trl import GRPOTrainer

    args = trl_config(**config_kw)
    adv = trl_advantages(case.rewards, G, scale_rewards or args.scale_rewards) if advantages is None else advantages
    lp = case.logprobs.clone().requires_grad_(True)
    b = len(case.rewards)
    inputs = {
        "prompt_ids": torch.ones(b, 1, dtype=torch.long), "prompt_mask": torch.ones(b, 1, dtype=torch.long),
        "completion_ids": torch.ones(b, T, dtype=torch.long), "completion_mask": case.mask.to(torch.long),
        "advantages": adv, "old_per_token_logps": case.old.clone(),
        "ref_per_token_logps": case.ref.clone(), "num_items_in_batch": case.mask.sum().to(torch.float64),
    }
    loss = GRPOTrainer._compute_loss(TRLStandIn(args, lp), None, inputs)
    loss.backward()
    return float(loss.detach()), lp.grad.detach(), adv


def trl_accumulated(config_kw: dict, case: Case, advantages: torch.Tensor,
                    micro: int = 2) -> tuple[float, torch.Tensor]:
    """TRL's loss and gradient accumulated over ``micro`` contiguous micro-batches of rows, as its
    training loop does with ``gradient_accumulation_steps=micro`` (``num_items_in_batch`` = the
    whole step's tokens, as TRL computes it over the generation batch)."""
    from trl import GRPOTrainer

    args = trl_config(gradient_accumulation_steps=micro, **config_kw)
    b = len(case.rewards)
    lp = case.logprobs.clone().requires_grad_(True)
    total = 0.0
    for rows in torch.arange(b).chunk(micro):
        m = case.mask[rows]
        inputs = {
            "prompt_ids": torch.ones(len(rows), 1, dtype=torch.long), "prompt_mask": torch.ones(len(rows), 1,
                                                                                             dtype=torch.long),
            "completion_ids": torch.ones(len(rows), T, dtype=torch.long), "completion_mask": m.to(torch.long),
            "advantages": advantages[rows], "old_per_token_logps": case.old[rows].clone(),
            "ref_per_token_logps": case.ref[rows].clone(), "num_items_in_batch": case.mask.sum().to(torch.float64),
        }
        loss = GRPOTrainer._compute_loss(TRLStandIn(args, lp[rows]), None, inputs)
        loss.backward()
        total += float(loss.detach())
    return total, lp.grad.detach()


def ours_accumulated(spec, case: Case, micro: int = 2, parts: list | None = None) -> tuple[float, torch.Tensor]:
    """Ours over ``micro`` contiguous micro-batches (``StepBatch.split``), normalised by the step's
    totals; each micro-batch's loss is appended to ``parts`` when given."""
    run = policyzoo.assemble(spec)
    b = len(case.rewards)
    rollout = Rollout(prompt_ids=[[1]] * b, response_ids=torch.ones(b, T, dtype=torch.long),
                      response_mask=case.mask.clone(), rollout_logprobs=case.old.clone(),
                      group_ids=case.group_ids.clone(), truncated=torch.zeros(b, dtype=torch.bool))
    batch, _ = prepare(run, StepBatch(rollout, case.rewards.clone(), old_logprobs=case.old.clone(),
                                      ref_logprobs=case.ref.clone() if run.kl is not None else None))
    totals = step_totals(batch)
    lp = case.logprobs.clone().requires_grad_(True)
    total = 0.0
    for rows, mb in zip(torch.arange(b).chunk(micro), batch.split(micro)):
        loss, _ = micro_loss(run, mb, lp[rows], totals)
        loss.backward()
        total += float(loss.detach())
        if parts is not None:
            parts.append(float(loss.detach()))
    return total, lp.grad.detach()


# ----------------------------------------------------------------------------- the cases
#: (label, our spec, TRL GRPOConfig kwargs, scale_rewards, expected, the convention)
#: expected: "equal", or a short formula the test checks.
CASES = [
    ("grpo", {"base": "grpo", "baseline": {"eps": 1e-4, "zero_std_tol": 0.0}},
     dict(loss_type="grpo", beta=0.04, use_bias_correction_kl=False), None, "equal",
     "TRL loss_type='grpo' is ours seq_mean_token_mean; our std eps set to TRL's 1e-4; TRL's "
     "default KL-times-ratio correction off"),
    ("grpo, TRL KL x ratio (TRL default)", {"base": "grpo", "baseline": {"eps": 1e-4, "zero_std_tol": 0.0}},
     dict(loss_type="grpo", beta=0.04), None, "kl_times_ratio",
     "TRL use_bias_correction_kl=True (its default) multiplies k3 by the IS ratio (DeepSeek-V3.2): "
     "per token the loss differs by beta k3 (r-1), the gradient by beta [(r-1) k3' + r k3]; no such term in ours"),
    ("grpo, our std eps 1e-6 (default)", "grpo", dict(loss_type="grpo", beta=0.04, use_bias_correction_kl=False),
     None, "eps", "A = (r-mean)/(std+eps): ours eps 1e-6, TRL 1e-4 (relative change ~1e-4/std)"),
    ("dapo", {"base": "dapo", "baseline": {"eps": 1e-4}, "reward": [], "filter": []},
     dict(loss_type="dapo", epsilon=0.2, epsilon_high=0.28, beta=0.0), None, "equal",
     "TRL 'dapo' = token sum / tokens of the whole step (num_items_in_batch) = ours token_mean; DAPO's "
     "filter and overlong penalty are not part of TRL's loss (kept out here)"),
    ("dr_grpo", {"base": "dr_grpo", "reduce": {"constant": float(T)}},
     dict(loss_type="dr_grpo", beta=0.0), "none", "equal",
     "TRL scale_rewards='none' = ours group_mean; TRL's constant is max_completion_length = our "
     "token_sum_norm constant (default sample.max_tokens)"),
    ("gspo", {"base": "gspo", "baseline": {"eps": 1e-4}},
     dict(loss_type="grpo", importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4, beta=0.0),
     None, "equal", "TRL GSPO = importance_sampling_level='sequence' with loss_type='grpo', eps 3e-4/4e-4"),
    ("cispo", {"base": "cispo", "baseline": {"eps": 1e-4}},
     dict(loss_type="cispo", epsilon_high=5.0, beta=0.0), None, "equal",
     "both bound the IS weight itself (min(r, 5)), stop-gradient; TRL 'cispo' reduces like 'dapo' = ours token_mean"),
    ("TRL default GRPOConfig", {"base": "grpo", "reduce": "token_mean", "kl": None, "baseline": {"eps": 1e-4}},
     dict(), None, "equal",
     "TRL's default (loss_type='dapo', beta=0) is not the GRPO paper's loss: it equals our grpo with "
     "reduce token_mean and no kl"),
    ("grpo, k3 times_ratio = TRL KL x ratio",
     {"base": "grpo", "baseline": {"eps": 1e-4, "zero_std_tol": 0.0}, "kl": {"times_ratio": True}},
     dict(loss_type="grpo", beta=0.04), None, "equal",
     "our k3 with times_ratio: true multiplies by the ratio slot's ratio with grad, as TRL's default "
     "use_bias_correction_kl=True multiplies by coef_1"),
    ("gspo + k3 times_ratio = TRL sequence level with KL x ratio",
     {"base": "gspo", "baseline": {"eps": 1e-4}, "kl": {"use": "k3", "beta": 0.04, "times_ratio": True}},
     dict(loss_type="grpo", importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4, beta=0.04),
     None, "equal", "with a sequence ratio TRL's KL correction uses the sequence ratio coef_1 [B, 1]; ours the "
     "ratio slot's output, the same s_i broadcast"),
    ("luspo", {"base": "luspo", "baseline": {"eps": 1e-4}},
     dict(loss_type="luspo", importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4, beta=0.0),
     None, "equal", "TRL 'luspo' = sequence ratio, PPO clip, per-row token sum, mean over rows = ours gspo's "
     "ratio and clip with reduce seq_mean_token_sum (no empty row here: TRL divides by B, ours by N)"),
    ("vespo", {"base": "grpo", "clip": "vespo", "reduce": "token_mean", "kl": None, "baseline": {"eps": 1e-4}},
     dict(loss_type="vespo", beta=0.0), None, "equal",
     "TRL 'vespo' (token-level IS, its default k/lambda) reduces like 'dapo' = ours token_mean"),
]


def compare(spec, config_kw, scale_rewards, case: Case, same_advantages: bool = False):
    """Both sides on ``case``; ``same_advantages``: TRL's loss gets our advantages."""
    lo, go, ao = ours(spec, case)
    lt, gt, at = trl(config_kw, case, scale_rewards, ao if same_advantages else None)
    return dict(loss_ours=lo, loss_trl=lt, grad_diff=float((go - gt).abs().max()),
                grad_scale=float(gt.abs().max()), adv_diff=float((ao - at).abs().max()))


def main() -> None:
    import trl as trl_pkg

    torch.set_num_threads(1)
    case = make_case()
    print(f"TRL {trl_pkg.__version__}, policyzoo {policyzoo.__version__}, torch {torch.__version__}; "
          f"B={len(case.rewards)} (P=2 x G={G}), T={T}, lengths {list(LENGTHS)}, float64\n")
    print("| case | loss ours | loss TRL | max abs grad diff (max abs grad) | max abs adv diff | convention |")
    print("|---|---|---|---|---|---|")
    for label, spec, kw, sr, _, why in CASES:
        r = compare(spec, kw, sr, case)
        print(f"| {label} | {r['loss_ours']:.10f} | {r['loss_trl']:.10f} | {r['grad_diff']:.1e} "
              f"({r['grad_scale']:.3f}) | {r['adv_diff']:.1e} | {why} |")
    extra = extra_cases()
    for label, r, why in extra:
        print(f"| {label} | {r['loss_ours']:.6g} | {r['loss_trl']:.6g} | {r['grad_diff']:.1e} "
              f"({r['grad_scale']:.3g}) | {r['adv_diff']:.1e} | {why} |")


def extra_cases():
    """Inputs where a convention changes the numbers (not a setting): an empty row, and a GSPO
    sequence log-ratio of 50."""
    out = []
    empty = make_case(lengths=EMPTY_ROW)
    out.append(("grpo, a row with no token, same advantages (B=8, N=7)",
                compare(CASES[0][1], CASES[0][2], None, empty, same_advantages=True),
                "TRL 'grpo'/'dr_grpo' divide by all B rows (incl. rows with every token masked, e.g. by "
                "mask_truncated_completions); ours by the N rows with a token: ours = TRL x 8/7 (loss and grad)"))
    out.append(("grpo, a row with no token, own advantages", compare(CASES[0][1], CASES[0][2], None, empty),
                "the empty row's reward enters TRL's group mean/std; ours excludes it (and gives it A = 0)"))
    c = make_case(lengths=UNEVEN)
    adv = ours(CASES[0][1], c)[2]
    for label, spec, kw, why in MICRO_CASES:
        lo, go = ours_accumulated(spec, c)
        lt, gt = trl_accumulated(kw, c, adv)
        r = dict(loss_ours=lo, loss_trl=lt, grad_diff=float((go - gt).abs().max()), grad_scale=float(gt.abs().max()),
                 adv_diff=0.0)
        out.append((label, r, why))
    far = make_case()
    far.old[4] = far.logprobs[4] - 50.0  # row 4 (A < 0): mean log r = 50
    r = compare(CASES[5][1], CASES[5][2], None, far)
    out.append(("gspo, mean log r = 50 on a row with A < 0", r,
                "ours clamps the sequence log-ratio at +-10 before exp (gradient 0 there); TRL takes exp(50) "
                "~ 5e21 unclamped"))
    return out


if __name__ == "__main__":
    main()
