"""KL variants: abs, the straight-through '+' variants, k3 times the ratio (TRL's
use_bias_correction_kl) and the optional k3 clamp -- values and gradients by hand, the expected
gradient of each computed exactly, and the warnings."""

import math
import warnings

import pytest
import torch

import policyzoo
from policyzoo.plugins.kl import K1, K3, Abs

MASK = torch.ones(1, 2, dtype=torch.bool)
REF = torch.tensor([[-1.5, -1.0]], dtype=torch.float64)  # with lp = [-1, -2]: log r = [0.5, -1.0]
ONES = torch.ones(1, 2, dtype=torch.float64)


def lp_leaf():
    return torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)


def value_and_grad(comp, ratio=ONES, lp=None):
    lp = lp_leaf() if lp is None else lp
    out = comp.kl(logprobs=lp, ref_logprobs=REF, response_mask=MASK, ratio=ratio)
    out.sum().backward()
    return out.detach()[0].tolist(), lp.grad[0].tolist()


def test_abs_value_and_gradient():
    # |log r| = [0.5, 1.0]; d/d lp = sign(log r) = [1, -1]
    assert value_and_grad(Abs()) == ([0.5, 1.0], [1.0, -1.0])


@pytest.mark.parametrize("comp, value", [
    (K1(straight_through=True), [0.5, -1.0]),                                  # k1+
    (K3(straight_through=True), [math.exp(-0.5) - 0.5, math.e - 2.0]),         # k3+ = low_var_kl+
    (Abs(straight_through=True), [0.5, 1.0]),                                  # abs+
])
def test_straight_through_keeps_the_value_and_takes_k2s_gradient(comp, value):
    # d k2 / d lp = log r = [0.5, -1.0] whatever the estimator's value
    v, g = value_and_grad(comp)
    assert v == pytest.approx(value) and g == pytest.approx([0.5, -1.0])


def test_k3_times_ratio_by_hand():
    # old = [-1.2, -2.0]: r = [e^0.2, 1] = [1.2214028, 1]; k3 = [0.1065307, 0.7182818].
    # value r k3 = [0.1301169, 0.7182818]; d(r k3)/d lp = r k3 + r (1 - e^-log r) = r log r
    # (since k3 + 1 - e^-log r = log r) = [1.2214028 x 0.5, 1 x -1] = [0.6107014, -1.0]
    lp = lp_leaf()
    ratio = torch.exp(lp - torch.tensor([[-1.2, -2.0]], dtype=torch.float64))
    v, g = value_and_grad(K3(times_ratio=True), ratio=ratio, lp=lp)
    assert v == pytest.approx([0.1301169, 0.7182818], rel=1e-6)
    assert g == pytest.approx([0.6107014, -1.0], rel=1e-6)


def test_k3_clamp_like_verl():
    # log r = -100: k3 = e^20 - 101 = 4.85e8 unclamped; clamp 10 -> 10 with no gradient
    lp = torch.tensor([[-100.0]], requires_grad=True)
    kw = dict(logprobs=lp, ref_logprobs=torch.zeros(1, 1), response_mask=torch.ones(1, 1, dtype=torch.bool),
              ratio=torch.ones(1, 1))
    assert K3().kl(**kw).item() == pytest.approx(math.exp(20) - 101, rel=1e-6)
    out = K3(clamp=10.0).kl(**kw)
    out.sum().backward()
    assert out.item() == 10.0 and lp.grad.item() == 0.0


def test_expected_gradients_of_the_variants_are_the_reverse_kl_gradient():
    # Summed exactly over a 4-way categorical (each y a token), on-policy (ratio = exp(lp - sg(lp)) = 1):
    # E_pi[grad k] in the loss for k1+, k3+ and k3 x ratio all equal grad KL(pi||ref).
    theta = torch.tensor([0.3, -0.2, 1.0, 0.1], dtype=torch.float64, requires_grad=True)
    log_ref = torch.log_softmax(torch.tensor([0.0, 0.5, -0.4, 0.2], dtype=torch.float64), 0)
    mask = torch.ones(1, 4, dtype=torch.bool)

    def expected_grad(comp):
        lp = torch.log_softmax(theta, 0).unsqueeze(0)
        k = comp.kl(logprobs=lp, ref_logprobs=log_ref.unsqueeze(0), response_mask=mask,
                    ratio=torch.exp(lp - lp.detach()))
        (g,) = torch.autograd.grad((lp.exp().detach() * k).sum(), theta)
        return g

    lp = torch.log_softmax(theta, 0)
    (kl,) = torch.autograd.grad((lp.exp() * (lp - log_ref)).sum(), theta)
    assert kl.abs().sum() > 1e-2
    for comp in (K1(straight_through=True), K3(straight_through=True), K3(times_ratio=True)):
        assert torch.allclose(expected_grad(comp), kl, atol=1e-12), comp
    assert not torch.allclose(expected_grad(K3()), kl, atol=1e-3)  # plain k3 in the loss: KL(ref||pi)'s


def test_warnings():
    with warnings.catch_warnings():  # sound: straight-through in the loss (k1+), k3 x ratio in the loss
        warnings.simplefilter("error")
        policyzoo.assemble({"base": "grpo", "kl": {"use": "k1", "placement": "loss", "straight_through": True}})
        policyzoo.assemble({"base": "grpo", "kl": {"times_ratio": True}})
        policyzoo.assemble({"base": "grpo", "kl": {"use": "abs", "straight_through": True}})
    with pytest.warns(UserWarning, match="not the gradient of a KL"):
        policyzoo.assemble({"base": "grpo", "kl": {"use": "abs"}})
    with pytest.warns(UserWarning, match="times_ratio changes nothing"):
        policyzoo.assemble({"base": "ppo", "kl": {"times_ratio": True}})
