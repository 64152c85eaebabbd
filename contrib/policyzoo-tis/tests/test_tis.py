"""policyzoo-tis: the truncated IS ratio against values worked out by hand.

ratio_t = exp(logprobs_t - old_t) * w; sequence level w_i = exp(min(sum_t (old - rollout), log C)).
"""

import math

import pytest
import torch

from policyzoo import ConfigError, assemble, resolve_algorithm
from policyzoo.catalog import load_catalog
from policyzoo_tis import TruncatedIS

MASK = torch.tensor([[True, True, True], [True, True, False], [True, True, True]])
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, -7.0], [-0.5, -0.5, -0.5]])
# old - rollout: row 0 = [0.1, 0.2, 0.3] (sum 0.6), row 1 = [0.5, 0.5, masked 3.0] (sum 1.0),
# row 2 = [-0.2, -0.3, -0.5] (sum -1.0)
ROLLOUT = OLD - torch.tensor([[0.1, 0.2, 0.3], [0.5, 0.5, 3.0], [-0.2, -0.3, -0.5]])


def _ratio(logprobs, **params):
    return TruncatedIS(**params).ratio(logprobs=logprobs, old_logprobs=OLD, rollout_logprobs=ROLLOUT,
                                       response_mask=MASK)


def test_sequence_weight_is_the_capped_sum_by_hand():
    # logprobs == old: the token ratio is 1, so the ratio is the weight itself (cap C = 2, log 2 = 0.693147).
    # row 0: sum 0.6 < 0.693147 -> w = e^0.6 = 1.822119
    # row 1: sum 0.5 + 0.5 = 1.0 (the masked 3.0 is ignored) > 0.693147 -> w = 2 (the cap)
    # row 2: sum -1.0 -> w = e^-1 = 0.367879 (no lower bound)
    r = _ratio(OLD.clone().requires_grad_(True))
    assert r[0].tolist() == pytest.approx([1.822119] * 3, abs=1e-5)
    assert r[1, :2].tolist() == pytest.approx([2.0, 2.0], abs=1e-6)
    assert r[1, 2].item() == 1.0  # masked position
    assert r[2].tolist() == pytest.approx([0.367879] * 3, abs=1e-6)


def test_sum_not_mean_unlike_gspo():
    # GSPO's sequence ratio would use the MEAN log-ratio: row 0 mean 0.2 -> e^0.2 = 1.221403.
    # TIS uses the SUM (0.6 -> 1.822119): the two differ by design.
    r = _ratio(OLD.clone().requires_grad_(True), cap=100.0)
    assert r[0, 0].item() == pytest.approx(math.exp(0.6), abs=1e-5)
    assert r[0, 0].item() != pytest.approx(math.exp(0.2), abs=1e-3)


def test_token_level_caps_each_token_by_hand():
    # level token, C = 1.5 (log 1.5 = 0.405465): row 1 tokens 0.5, 0.5 -> min(e^0.5 = 1.648721, 1.5) = 1.5;
    # row 0 tokens e^0.1 = 1.105171, e^0.2 = 1.221403, e^0.3 = 1.349859 (all below the cap).
    r = _ratio(OLD.clone().requires_grad_(True), level="token", cap=1.5)
    assert r[0].tolist() == pytest.approx([1.105171, 1.221403, 1.349859], abs=1e-5)
    assert r[1, :2].tolist() == pytest.approx([1.5, 1.5], abs=1e-6)


def test_weight_is_a_constant_and_token_ratio_carries_the_gradient():
    # logprobs = old + 0.1 on row 0: token ratio e^0.1 = 1.105171, ratio = 1.105171 * 1.822119 = 2.013753;
    # d ratio / d logprob = ratio (w has no gradient) = 2.013753 on row 0 (row 0 is all valid).
    lp = (OLD + torch.tensor([[0.1], [0.0], [0.0]])).requires_grad_(True)
    r = _ratio(lp)
    r.sum().backward()
    assert r[0, 0].item() == pytest.approx(2.013753, abs=1e-5)
    assert lp.grad[0].tolist() == pytest.approx([2.013753] * 3, abs=1e-5)
    assert lp.grad[1, 2].item() == 0.0  # masked


def test_exactly_one_without_mismatch_and_finite_when_extreme():
    lp = OLD.clone().requires_grad_(True)
    r = TruncatedIS().ratio(logprobs=lp, old_logprobs=OLD, rollout_logprobs=OLD, response_mask=MASK)
    assert torch.equal(r, torch.ones_like(r))
    huge = TruncatedIS().ratio(logprobs=lp, old_logprobs=OLD, rollout_logprobs=OLD - 500.0, response_mask=MASK)
    tiny = TruncatedIS().ratio(logprobs=lp, old_logprobs=OLD, rollout_logprobs=OLD + 500.0, response_mask=MASK)
    assert torch.allclose(huge, torch.full_like(huge, 2.0).where(MASK, torch.ones_like(huge)))
    assert torch.isfinite(tiny).all() and (tiny[MASK] >= 0).all()


def test_bad_parameters_are_config_errors():
    with pytest.raises(ConfigError, match="cap"):
        TruncatedIS(cap=0.0)
    with pytest.raises(ConfigError, match="level"):
        TruncatedIS(level="row")


def test_hybrid_with_a_zoo_bundle():
    import policyzoo_tis

    catalog = load_catalog(autoload=False, extra=[policyzoo_tis])
    bundle = resolve_algorithm({"base": "dapo", "ratio": {"use": "tis", "cap": 3.0}}, catalog)
    with pytest.warns(UserWarning, match="acts on r x w"):  # DAPO's clip range is below the cap
        run = assemble(bundle, catalog=catalog)
    assert run.ratio.name == "tis" and run.ratio.params.cap == 3.0 and run.clip.name == "ppo_clip"


def test_where_the_weight_meets_the_clip():
    # On-policy (old = logprobs.detach()) with w = e^0.6 = 1.822119 on every token of one row, A = +1.
    # clip none: loss -A r w, d loss / d logprob = -w = -1.822119 per token (Yao et al.'s TIS gradient).
    # ppo_clip eps 0.2: r w = 1.822 > 1.2 with A > 0 -> clipped, gradient 0 (our stated convention).
    import warnings

    from policyzoo.plugins.clip import NoClip, PPOClip

    mask = torch.ones(1, 3, dtype=torch.bool)
    lp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    ratio = TruncatedIS().ratio(logprobs=lp, old_logprobs=lp.detach(), rollout_logprobs=lp.detach() - 0.2,
                                response_mask=mask)
    adv = torch.ones(1, 3)
    (g_none,) = torch.autograd.grad(NoClip().clip(ratio=ratio, advantages=adv).loss.sum(), lp, retain_graph=True)
    (g_ppo,) = torch.autograd.grad(PPOClip().clip(ratio=ratio, advantages=adv, response_mask=mask).loss.sum(), lp)
    assert g_none[0].tolist() == pytest.approx([-1.822119] * 3, abs=1e-5)
    assert g_ppo[0].tolist() == [0.0, 0.0, 0.0]
    # assembling tis with a PPO clip whose range is below the cap warns, with clip none it does not
    import policyzoo_tis

    catalog = load_catalog(autoload=False, extra=[policyzoo_tis])
    with pytest.warns(UserWarning, match="acts on r x w"):
        assemble({"base": "grpo", "ratio": {"use": "tis"}}, catalog=catalog)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assemble({"base": "grpo", "ratio": {"use": "tis", "cap": 1.2}}, catalog=catalog)
        assemble({"base": "rloo", "ratio": {"use": "tis"}}, catalog=catalog)
