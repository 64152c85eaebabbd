"""policyzoo-sapo: the soft gate against values worked out by hand from arXiv:2511.20347.

f(r) = (4/tau) sigmoid(tau (r - 1)); loss = -f(r) A; d loss / d logprob = -A 4 s (1 - s) r
(r = exp(logprob - old), so dr/dlogprob = r; s = sigmoid(tau (r - 1))).
"""

import math

import pytest
import torch
from policyzoo_sapo import BUNDLE, SoftGate

from policyzoo import ConfigError, assemble, resolve_algorithm, use
from policyzoo.catalog import load_catalog


def _gate_loss_and_grad(r, a, **params):
    old = torch.zeros(1, len(r))
    logprobs = torch.log(torch.tensor([r], dtype=torch.float64)).float().requires_grad_(True)
    ratio = torch.exp(logprobs - old)
    mask = torch.ones(1, len(r), dtype=torch.bool)
    out = SoftGate(**params).clip(ratio=ratio, advantages=torch.tensor([a]), response_mask=mask)
    out.loss.sum().backward()
    return out, logprobs.grad[0]


def test_positive_advantage_above_one_by_hand():
    # r = 1.5, A = +1, tau_pos = 1: x = 0.5, sigmoid(0.5) = 1 / (1 + e^-0.5) = 1 / 1.606531 = 0.622459
    # loss = -(4/1) * 0.622459 * 1 = -2.489837
    # grad = -A * 4 s (1 - s) * r = -4 * 0.622459 * 0.377541 * 1.5 = -0.940015 * 1.5 = -1.410022
    out, grad = _gate_loss_and_grad([1.5], [1.0])
    assert out.loss.item() == pytest.approx(-2.489837, abs=1e-5)
    assert grad.item() == pytest.approx(-1.410022, abs=1e-5)


def test_negative_advantage_uses_tau_neg_by_hand():
    # r = 0.5, A = -1, tau_neg = 1.05: x = 1.05 * (0.5 - 1) = -0.525
    # sigmoid(-0.525) = 1 / (1 + e^0.525) = 1 / (1 + 1.690459) = 0.371684
    # loss = -(4 / 1.05) * 0.371684 * (-1) = +1.415938
    # grad = -(-1) * 4 * 0.371684 * 0.628316 * 0.5 = 0.934140 * 0.5 = 0.467070
    out, grad = _gate_loss_and_grad([0.5], [-1.0])
    assert out.loss.item() == pytest.approx(1.415938, abs=1e-5)
    assert grad.item() == pytest.approx(0.467070, abs=1e-5)


def test_on_policy_gradient_is_the_plain_policy_gradient():
    # r = 1: s = 1/2, 4 s (1 - s) = 1, so grad = -A exactly, for every tau; the loss value is -2A/tau.
    out, grad = _gate_loss_and_grad([1.0, 1.0], [0.7, -2.0], tau_pos=3.0, tau_neg=0.5)
    assert grad.tolist() == pytest.approx([-0.7, 2.0], abs=1e-6)
    assert out.loss[0].tolist() == pytest.approx([-2 * 0.7 / 3.0, -2 * -2.0 / 0.5], abs=1e-6)


def test_gate_is_soft_where_ppo_is_hard():
    # At r = 1.5 with A > 0 PPO (eps 0.2) passes no gradient; the gate still passes 1.410022 (above).
    # At r = 3, tau 1: s = sigmoid(2) = 0.880797, weight 4 * 0.880797 * 0.119203 = 0.419974 < 0.5:
    # counted in clipped_high; r = 1.5 (weight 0.940015) is not.
    out, _ = _gate_loss_and_grad([1.5, 3.0], [1.0, 1.0])
    assert out.clipped_high[0].tolist() == [False, True]
    assert not out.clipped_low.any()


def test_masked_positions_carry_no_loss_and_no_gradient():
    logprobs = torch.tensor([[-0.5, -9.0]], requires_grad=True)
    ratio = torch.exp(logprobs - torch.tensor([[-0.4, -1.0]]))
    mask = torch.tensor([[True, False]])
    out = SoftGate().clip(ratio=ratio, advantages=torch.tensor([[1.0, 4.0]]), response_mask=mask)
    out.loss.sum().backward()
    assert out.loss[0, 1].item() == 0.0 and logprobs.grad[0, 1].item() == 0.0


def test_temperatures_must_be_positive():
    with pytest.raises(ConfigError, match="tau_neg"):
        SoftGate(tau_neg=0.0)


def test_bundle_and_hybrid_resolve_through_the_catalog():
    import policyzoo_sapo

    catalog = load_catalog(autoload=False, extra=[policyzoo_sapo])
    run = assemble("sapo", catalog=catalog)
    assert run.clip.name == "sapo" and run.kl is None and BUNDLE.parent == "grpo"
    assert run.sources["clip"].startswith("sapo from ")
    # A hybrid: GRPO (with its k3 KL) and the soft gate in place of the clip.
    hybrid = resolve_algorithm({"base": "grpo", "clip": {"use": "sapo", "tau_neg": 2.0}}, catalog)
    assert hybrid.clip == use("sapo", tau_neg=2.0) and hybrid.kl.name == "k3"
    assert math.isclose(assemble(hybrid, catalog=catalog).clip.params.tau_neg, 2.0)
