"""policyzoo-tis: the geometric-mean TIS ratio against values worked out by hand.

ratio_t = exp(logprobs_t - old_t); weight w_i = exp(min(mean_t (old - rollout), log C)) on the loss.
"""

import math
import warnings

import pytest
import torch
from policyzoo_tis import GeometricTIS

from policyzoo import ConfigError, Importance, assemble, resolve_algorithm
from policyzoo.catalog import load_catalog
from policyzoo.testing import check_component

MASK = torch.tensor([[True, True, True], [True, True, False], [True, True, True]])
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, -7.0], [-0.5, -0.5, -0.5]])
# old - rollout: row 0 = [0.1, 0.2, 0.3] (mean 0.2), row 1 = [0.5, 0.5, masked 3.0] (mean 0.5),
# row 2 = [-0.2, -0.3, -0.5] (mean -1/3)
ROLLOUT = OLD - torch.tensor([[0.1, 0.2, 0.3], [0.5, 0.5, 3.0], [-0.2, -0.3, -0.5]])


def _ratio(logprobs, **params):
    return GeometricTIS(**params).ratio(logprobs=logprobs, old_logprobs=OLD, rollout_logprobs=ROLLOUT,
                                        response_mask=MASK)


def _catalog():
    import policyzoo_tis

    return load_catalog(autoload=False, extra=[policyzoo_tis])


def test_weight_is_the_capped_geometric_mean_by_hand():
    # logprobs == old: ratio 1, the weight goes on the loss (cap 2, log 2 = 0.693147, none reached):
    # row 0: e^0.2 = 1.221403; row 1: e^0.5 = 1.648721 (the masked 3.0 is ignored); row 2: e^(-1/3) = 0.716531.
    out = _ratio(OLD.clone().requires_grad_(True))
    assert isinstance(out, Importance) and torch.equal(out.ratio, torch.ones(3, 3))
    assert out.weight[0].tolist() == pytest.approx([1.221403] * 3, abs=1e-5)
    assert out.weight[1, :2].tolist() == pytest.approx([1.648721] * 2, abs=1e-5)
    assert out.weight[2].tolist() == pytest.approx([0.716531] * 3, abs=1e-5)
    assert not out.truncated.any() and not out.weight.requires_grad


def test_mean_not_sum_unlike_the_builtin_tis():
    # The built-in tis takes the SUM of the log-ratios: row 0 e^0.6 = 1.822119; geo_tis the MEAN: e^0.2.
    from policyzoo.plugins.ratio.mismatch import TIS

    lp = OLD.clone().requires_grad_(True)
    builtin = TIS(cap=100.0).ratio(logprobs=lp, old_logprobs=OLD, rollout_logprobs=ROLLOUT, response_mask=MASK,
                                   advantages=torch.ones(3, 3))
    assert builtin.weight[0, 0].item() == pytest.approx(math.exp(0.6), abs=1e-5)
    assert _ratio(lp, cap=100.0).weight[0, 0].item() == pytest.approx(math.exp(0.2), abs=1e-5)


def test_cap_truncates_by_hand():
    # cap 1.5 (log 0.405465): row 1 mean 0.5 > 0.405465 -> w = 1.5, its two valid tokens truncated.
    out = _ratio(OLD.clone().requires_grad_(True), cap=1.5)
    assert out.weight[1, :2].tolist() == pytest.approx([1.5, 1.5], abs=1e-6)
    assert out.truncated.tolist() == [[False] * 3, [True, True, False], [False] * 3]


def test_on_the_ratio_the_weight_is_a_constant_factor():
    # placement ratio, logprobs = old + 0.1 on row 0: r = e^0.1 = 1.105171, r w = 1.105171 x 1.221403 = 1.349859,
    # d(r w) / d logprob = r w (w has no gradient).
    lp = (OLD + torch.tensor([[0.1], [0.0], [0.0]])).requires_grad_(True)
    out = _ratio(lp, placement="ratio")
    assert out.weight is None
    out.ratio.sum().backward()
    assert lp.grad[0].tolist() == pytest.approx([1.349859] * 3, abs=1e-5)
    assert lp.grad[1, 2].item() == 0.0  # masked


def test_exactly_one_without_mismatch_and_bad_parameters():
    lp = OLD.clone().requires_grad_(True)
    out = GeometricTIS().ratio(logprobs=lp, old_logprobs=OLD, rollout_logprobs=OLD, response_mask=MASK)
    assert torch.equal(out.ratio, torch.ones(3, 3)) and torch.equal(out.weight, torch.ones(3, 3))
    for bad in ({"cap": 0.5}, {"placement": "clip"}, {"max_log_ratio": 0.0}):
        with pytest.raises(ConfigError):
            GeometricTIS(**bad)


def test_passes_the_contract_and_forms_a_hybrid_with_a_zoo_bundle():
    check_component(GeometricTIS, _catalog())
    bundle = resolve_algorithm({"base": "dapo", "ratio": {"use": "geo_tis", "cap": 1.5}}, _catalog())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run = assemble(bundle, catalog=_catalog())
    assert run.ratio.name == "geo_tis" and run.ratio.params.cap == 1.5 and run.clip.name == "ppo_clip"
    assert run.sources["ratio"].startswith("geo_tis from (in-process)")
