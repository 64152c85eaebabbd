"""The rollout/trainer mismatch corrections (tis, mis, icepop, opsm) against values worked out by hand,
and where their weight meets the clip, the KL and the reduce in the step."""

import math
import warnings

import pytest
import torch

from policyzoo import ConfigError, Importance, assemble
from policyzoo.contract import Rollout, StepBatch
from policyzoo.plugins.ratio.mismatch import MIS, OPSM, TIS, IcePop
from policyzoo.step import micro_loss, step_totals
from policyzoo.step.boundary import problems

MASK = torch.tensor([[True, True, True], [True, True, False], [True, True, True]])
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, -7.0], [-0.5, -0.5, -0.5]])
# delta = old - rollout: row 0 = [0.1, 0.2, 0.3] (sum 0.6), row 1 = [0.5, 0.5, masked 3.0] (sum 1.0),
# row 2 = [-0.2, -0.3, -0.5] (sum -1.0)
DELTA = torch.tensor([[0.1, 0.2, 0.3], [0.5, 0.5, 3.0], [-0.2, -0.3, -0.5]])
ROLLOUT = OLD - DELTA
ONES = torch.ones(3, 3)


def _call(cls, logprobs=None, advantages=ONES, rollout=ROLLOUT, **params):
    lp = (OLD.clone() if logprobs is None else logprobs).requires_grad_(True)
    return cls(**params).ratio(logprobs=lp, old_logprobs=OLD, rollout_logprobs=rollout, response_mask=MASK,
                               advantages=advantages)


# ----------------------------------------------------------------------------- tis
def test_tis_sequence_weight_is_the_capped_likelihood_ratio():
    # logprobs == old: the ratio is 1 and the weight goes on the loss (placement loss, cap 2, log 2 = 0.693147).
    # row 0: sum 0.6 < 0.693147 -> w = e^0.6 = 1.822119; row 1: 0.5 + 0.5 = 1.0 (masked 3.0 ignored) > log 2
    # -> w = 2, truncated; row 2: sum -1 -> e^-1 = 0.367879 (no floor); masked position: w = 1.
    out = _call(TIS)
    assert isinstance(out, Importance) and out.masked is None
    assert torch.equal(out.ratio, torch.ones(3, 3)) and not out.weight.requires_grad
    assert out.weight[0].tolist() == pytest.approx([1.822119] * 3, abs=1e-5)
    assert out.weight[1].tolist() == pytest.approx([2.0, 2.0, 1.0], abs=1e-6)
    assert out.weight[2].tolist() == pytest.approx([0.367879] * 3, abs=1e-6)
    assert out.truncated.tolist() == [[False] * 3, [True, True, False], [False] * 3]


def test_tis_token_level_with_cap_and_floor():
    # cap 1.5 (log 0.405465), floor 0.75 (log -0.287682), per token:
    # row 0: e^0.1 = 1.105171, e^0.2 = 1.221403, e^0.3 = 1.349859; row 1: e^0.5 = 1.648721 -> 1.5 (truncated);
    # row 2: e^-0.2 = 0.818731, e^-0.3 = 0.740818 -> 0.75 (floored), e^-0.5 = 0.606531 -> 0.75 (floored).
    out = _call(TIS, level="token", cap=1.5, floor=0.75)
    assert out.weight[0].tolist() == pytest.approx([1.105171, 1.221403, 1.349859], abs=1e-5)
    assert out.weight[1, :2].tolist() == pytest.approx([1.5, 1.5], abs=1e-6)
    assert out.weight[2].tolist() == pytest.approx([0.818731, 0.75, 0.75], abs=1e-5)
    assert out.truncated.tolist() == [[False] * 3, [True, True, False], [False, True, True]]


def test_tis_on_the_ratio_multiplies_it_and_the_gradient_flows_through_r_only():
    # placement ratio: ratio = r w. logprobs = old + 0.1 on row 0: r = e^0.1 = 1.105171,
    # r w = 1.105171 x 1.822119 = 2.013753 = d(r w)/d logprob (w constant).
    lp = OLD + torch.tensor([[0.1], [0.0], [0.0]])
    lp.requires_grad_(True)
    out = TIS(placement="ratio").ratio(logprobs=lp, old_logprobs=OLD, rollout_logprobs=ROLLOUT,
                                       response_mask=MASK, advantages=ONES)
    assert out.weight is None
    out.ratio.sum().backward()
    assert out.ratio[0, 0].item() == pytest.approx(2.013753, abs=1e-5)
    assert lp.grad[0].tolist() == pytest.approx([2.013753] * 3, abs=1e-5)
    assert lp.grad[1, 2].item() == 0.0  # masked


def test_tis_exactly_one_without_mismatch_and_finite_when_extreme():
    same = _call(TIS, rollout=OLD)
    assert torch.equal(same.ratio, torch.ones(3, 3)) and torch.equal(same.weight, torch.ones(3, 3))
    huge, tiny = _call(TIS, rollout=OLD - 500.0), _call(TIS, rollout=OLD + 500.0)
    assert torch.equal(huge.weight[MASK], torch.full((8,), 2.0))  # capped
    assert torch.isfinite(tiny.weight).all() and (tiny.weight >= 0).all()


def test_tis_parameters_are_checked():
    for bad in ({"cap": 0.5}, {"floor": 1.5}, {"floor": 0.0}, {"level": "row"}, {"placement": "clip"}):
        with pytest.raises(ConfigError):
            TIS(**bad)


# ----------------------------------------------------------------------------- mis / icepop
def test_mis_sequence_zeroes_rows_outside_the_band():
    # high 2 (default): row 0 e^0.6 = 1.822119 kept; row 1 e^1 = 2.718282 > 2 -> weight 0 (masked);
    # row 2 e^-1 = 0.367879 kept (no low bound). With low 0.5: row 2 (0.367879 < 0.5) masked too.
    out = _call(MIS)
    assert out.truncated is None
    assert out.weight[0].tolist() == pytest.approx([1.822119] * 3, abs=1e-5)
    assert out.weight[1].tolist() == [0.0, 0.0, 1.0]  # masked position: 1
    assert out.weight[2].tolist() == pytest.approx([0.367879] * 3, abs=1e-6)
    assert out.masked.tolist() == [[False] * 3, [True, True, False], [False] * 3]
    both = _call(MIS, low=0.5)
    assert both.weight[2].tolist() == [0.0, 0.0, 0.0]


def test_mis_token_level_band():
    # band [0.7, 1.3] per token: row 0 e^0.1 = 1.105171, e^0.2 = 1.221403 kept, e^0.3 = 1.349859 masked;
    # row 1 e^0.5 = 1.648721 masked; row 2 e^-0.2 = 0.818731, e^-0.3 = 0.740818 kept, e^-0.5 = 0.606531 masked.
    out = _call(MIS, level="token", low=0.7, high=1.3)
    assert out.weight[0].tolist() == pytest.approx([1.105171, 1.221403, 0.0], abs=1e-5)
    assert out.weight[2].tolist() == pytest.approx([0.818731, 0.740818, 0.0], abs=1e-5)
    assert out.masked.tolist() == [[False, False, True], [True, True, False], [False, False, True]]


def test_mis_needs_a_bound_inside_the_right_range():
    with pytest.raises(ConfigError, match="give high, low or both"):
        MIS(high=None)
    for bad in ({"high": 0.9}, {"low": 1.1}):
        with pytest.raises(ConfigError):
            MIS(**bad)


def test_icepop_keeps_token_weights_inside_half_to_five():
    # delta per token 0.1, 1.7, -0.8 | 1.5, -0.6 | 0, -0.7, 1.6:
    # e^0.1 = 1.105171 kept, e^1.7 = 5.473947 > 5 masked, e^-0.8 = 0.449329 < 0.5 masked;
    # e^1.5 = 4.481689, e^-0.6 = 0.548812 kept; 1, e^-0.7 = 0.496585 < 0.5 masked, e^1.6 = 4.953032 kept.
    delta = torch.tensor([[0.1, 1.7, -0.8], [1.5, -0.6, 9.0], [0.0, -0.7, 1.6]])
    out = _call(IcePop, rollout=OLD - delta)
    assert out.weight.flatten().tolist() == pytest.approx([1.105171, 0.0, 0.0, 4.481689, 0.548812, 1.0,
                                                           1.0, 0.0, 4.953032], abs=1e-5)
    assert out.masked.tolist() == [[False, True, True], [False, False, False], [False, True, False]]
    with pytest.raises(ConfigError):
        IcePop(level="sequence")


# ----------------------------------------------------------------------------- opsm
def test_opsm_masks_negative_advantages_of_rows_that_drifted():
    # KL_i = mean_t (rollout - logprobs) with logprobs = old: row 0 -0.2, row 1 -0.5, row 2 +1/3 = 0.333333.
    # threshold 0.3: only row 2 is past it; its tokens with A < 0 (advantages -1, +1, -1) are zeroed.
    adv = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, 0.0], [-1.0, 1.0, -1.0]])
    out = _call(OPSM, advantages=adv, threshold=0.3)
    assert torch.equal(out.ratio, torch.ones(3, 3)) and out.truncated is None
    assert out.weight.tolist() == [[1.0] * 3, [1.0] * 3, [0.0, 1.0, 0.0]]
    assert out.masked.tolist() == [[False] * 3, [False] * 3, [True, False, True]]
    assert not _call(OPSM, advantages=adv, threshold=0.4).masked.any()  # 0.333333 <= 0.4


def test_opsm_measures_the_drift_from_the_current_policy():
    # Current logprobs 0.6 below old on row 0: rollout - logprobs = -delta + 0.6 = [0.5, 0.4, 0.3],
    # mean 0.4 > 0.3 -> row 0 (A = -1) is masked although its sampler/trainer KL alone is -0.2.
    lp = OLD - torch.tensor([[0.6], [0.0], [0.0]])
    out = _call(OPSM, logprobs=lp, advantages=-ONES, threshold=0.3)
    assert out.masked[0].tolist() == [True] * 3 and out.masked[2].tolist() == [True] * 3
    assert not out.masked[1].any()


# ----------------------------------------------------------------------------- in the step
def _one_row(delta, spec, adv=1.0):
    """micro_loss on one on-policy row of 3 tokens with old - rollout = ``delta``; returns (loss, grad, sums)."""
    run = assemble(spec)
    lp0 = torch.tensor([[-1.0, -2.0, -0.5]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    r = Rollout(prompt_ids=[[1]], response_ids=torch.ones(1, 3, dtype=torch.long), response_mask=mask,
                rollout_logprobs=lp0 - torch.tensor([delta]), group_ids=torch.tensor([0]),
                truncated=torch.zeros(1, dtype=torch.bool))
    batch = StepBatch(r, torch.tensor([1.0]), advantages=torch.full((1, 3), adv))
    lp = lp0.clone().requires_grad_(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss, sums = micro_loss(run, batch, lp, step_totals(batch))
    (grad,) = torch.autograd.grad(loss, lp)
    return float(loss), grad, sums


def test_the_step_puts_the_weight_on_the_clipped_loss():
    # On-policy (r = 1), A = +1, delta [0.1, 0.2, 0.3] -> sequence w = e^0.6 = 1.822119. GRPO's reduce
    # averages the row's 3 tokens. placement loss: the clip sees r = 1 (inside [0.8, 1.2]), per-token loss
    # -A r w, loss = -1.822119, d loss / d logprob = -w / 3 = -0.607373 per token (TRL/verl's gradient).
    spec = {"base": "grpo", "kl": None, "ratio": {"use": "tis"}}
    loss, grad, sums = _one_row([0.1, 0.2, 0.3], spec)
    assert loss == pytest.approx(-1.822119, abs=1e-5)
    assert grad[0].tolist() == pytest.approx([-0.607373] * 3, abs=1e-5)
    # mean |delta| = 0.6 / 3 = 0.2; nothing truncated (w < 2) or masked
    assert sums["mismatch/log_ratio_abs_mean"] == pytest.approx((0.6, 3.0), abs=1e-6)
    assert sums["mismatch/truncated_frac"] == (0.0, 3.0) and sums["mismatch/masked_frac"] == (0.0, 3.0)
    # placement ratio: the clip sees r w = 1.822119 > 1.2 with A > 0: clipped, loss -1.2, no gradient
    loss, grad, sums = _one_row([0.1, 0.2, 0.3], {**spec, "ratio": {"use": "tis", "placement": "ratio"}})
    assert loss == pytest.approx(-1.2, abs=1e-6) and grad.abs().max() == 0.0
    assert sums["clip_frac_high"] == (3.0, 3.0)


def test_truncated_and_masked_fractions_in_the_step():
    # cap 1.5 < e^0.6: all 3 tokens truncated, w = 1.5, loss = -1.5. mis with high 1.5: all 3 masked, loss 0.
    spec = {"base": "grpo", "kl": None}
    loss, _, sums = _one_row([0.1, 0.2, 0.3], {**spec, "ratio": {"use": "tis", "cap": 1.5}})
    assert loss == pytest.approx(-1.5, abs=1e-6) and sums["mismatch/truncated_frac"] == (3.0, 3.0)
    loss, grad, sums = _one_row([0.1, 0.2, 0.3], {**spec, "ratio": {"use": "mis", "high": 1.5}})
    assert loss == 0.0 and grad.abs().max() == 0.0 and sums["mismatch/masked_frac"] == (3.0, 3.0)


def test_the_kl_term_is_not_weighted():
    # GRPO with its k3 KL in the loss and mis masking the row: the policy term is 0 but beta x KL remains.
    # ref = logprobs - 0.1 per token: k3 = e^-0.1 - 1 + 0.1 = 0.004837; beta 0.04 -> loss 0.04 x 0.004837 = 1.9349e-4.
    run = assemble({"base": "grpo", "ratio": {"use": "mis", "high": 1.5}})
    lp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    mask = torch.ones(1, 3, dtype=torch.bool)
    r = Rollout(prompt_ids=[[1]], response_ids=torch.ones(1, 3, dtype=torch.long), response_mask=mask,
                rollout_logprobs=lp.detach() - 0.2, group_ids=torch.tensor([0]), truncated=torch.zeros(1, dtype=bool))
    batch = StepBatch(r, torch.tensor([1.0]), ref_logprobs=lp.detach() - 0.1, advantages=torch.ones(1, 3))
    loss, _ = micro_loss(run, batch, lp, step_totals(batch))
    assert float(loss) == pytest.approx(0.04 * (math.exp(-0.1) - 0.9), rel=1e-4)


def test_a_plain_ratio_reports_the_mismatch_too():
    # the built-in token ratio returns a bare tensor: mean |delta| is still reported, fractions 0
    _, _, sums = _one_row([0.1, -0.2, 0.3], {"base": "grpo", "kl": None})
    assert sums["mismatch/log_ratio_abs_mean"] == pytest.approx((0.6, 3.0), abs=1e-6)
    assert sums["mismatch/truncated_frac"] == (0.0, 3.0)


def test_the_boundary_refuses_a_weight_with_gradient_or_a_wrong_shape():
    r = torch.ones(2, 3)
    assert "detach it" in problems("ratio", Importance(r, torch.ones(2, 3, requires_grad=True)), 2, 3)[0]
    assert "weight is a tensor of shape [2]" in problems("ratio", Importance(r, torch.ones(2)), 2, 3)[0]
    assert "masked has dtype" in problems("ratio", Importance(r, masked=torch.ones(2, 3)), 2, 3)[0]
    assert problems("ratio", Importance(r, torch.ones(2, 3), torch.zeros(2, 3, dtype=torch.bool)), 2, 3) == []


def test_ratio_placement_with_a_narrow_clip_warns():
    with pytest.warns(UserWarning, match="acts on r x w"):  # cap 2 > 1 + DAPO's 0.28
        assemble({"base": "dapo", "ratio": {"use": "tis", "placement": "ratio"}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assemble({"base": "dapo", "ratio": {"use": "tis"}})  # on the loss: the clip sees r alone
        assemble({"base": "dapo", "ratio": {"use": "tis", "placement": "ratio", "cap": 1.28}})
        assemble({"base": "rloo", "ratio": {"use": "mis", "placement": "ratio"}})  # no clip range


@pytest.mark.parametrize("ratio", [{"use": "tis"}, {"use": "mis", "level": "token"}, {"use": "icepop"},
                                   {"use": "opsm"}, {"use": "tis", "placement": "ratio", "cap": 1.2}], ids=str)
def test_grpo_with_each_correction_trains_two_steps_on_the_bandit(ratio):
    from policyzoo.testing.training import tiny_run

    result = tiny_run({"base": "grpo", "ratio": ratio}, steps=2, updates_per_batch=2)
    assert len(result.history) == 2 and result.weights_changed
    for h in result.history:
        assert math.isfinite(h["loss"]) and h["skipped"] == 0
        # the bandit's sampler holds a copy of the trainer's logits: no engine mismatch to correct
        assert h["mismatch/log_ratio_abs_mean"] < 1e-6
        assert h["mismatch/truncated_frac"] == 0.0 and h["mismatch/masked_frac"] == 0.0
