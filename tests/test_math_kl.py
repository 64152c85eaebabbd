"""KL estimators: values by hand, masking, and the bias of each placement computed exactly."""

import math
import warnings

import pytest
import torch

import policyzoo
from policyzoo.errors import ConfigError
from policyzoo.plugins.kl import K1, K2, K3

ONES = torch.ones(1, 2)  # the ratio argument: 1 (sampling time, or an on-policy first update)


def test_estimator_values_by_hand():
    # log r = logprobs - ref = [-1 - (-1.5), -2 - (-1)] = [0.5, -1.0]
    lp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    kw = dict(logprobs=lp, ref_logprobs=ref, response_mask=mask, ratio=ONES)
    assert torch.allclose(K1().kl(**kw), torch.tensor([[0.5, -1.0]]))
    # k2 = (log r)^2 / 2 = [0.125, 0.5]
    assert torch.allclose(K2().kl(**kw), torch.tensor([[0.125, 0.5]]))
    # k3 = exp(-log r) - 1 + log r = [exp(-0.5) - 0.5, exp(1) - 2] = [0.106531, 0.718282]
    k3 = K3().kl(**kw)
    assert torch.allclose(k3, torch.tensor([[math.exp(-0.5) - 0.5, math.e - 2.0]]))


def test_masked_positions_are_zero_and_carry_no_gradient():
    lp = torch.tensor([[-1.0, 3.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -math.inf]])  # garbage on the padded position
    mask = torch.tensor([[True, False]])
    for comp in (K1(), K2(), K3()):
        lp.grad = None
        out = comp.kl(logprobs=lp, ref_logprobs=ref, response_mask=mask, ratio=ONES)
        assert out[0, 1].item() == 0.0
        out.sum().backward()
        assert torch.isfinite(lp.grad).all() and lp.grad[0, 1].item() == 0.0
    # d k3 / d lp = 1 - exp(-log r) = 1 - exp(-0.5) = 0.393469 on the valid token
    assert lp.grad[0, 0].item() == pytest.approx(1 - math.exp(-0.5), rel=1e-6)


def test_k3_finite_for_extreme_log_ratio():
    # log r = -100: exp(100) = 2.7e43 overflows float32 (max 3.4e38) to inf; with log r clamped to
    # -20 inside exp only: k3 = exp(20) - 1 + (-100) = 4.851652e8 - 101
    out = K3().kl(logprobs=torch.tensor([[-100.0]]), ref_logprobs=torch.zeros(1, 1),
                  response_mask=torch.ones(1, 1, dtype=torch.bool), ratio=torch.ones(1, 1))
    assert out.item() == pytest.approx(math.exp(20) - 101, rel=1e-6)


def exact_gradients():
    """Expected gradients under y ~ pi of every (estimator, placement), summed exactly over a
    4-way categorical (each y is a 'token'), plus the true gradients of KL(pi||ref), KL(ref||pi)."""
    theta = torch.tensor([0.3, -0.2, 1.0, 0.1], requires_grad=True)
    log_ref = torch.log_softmax(torch.tensor([0.0, 0.5, -0.4, 0.2]), 0)
    mask = torch.ones(1, 4, dtype=torch.bool)

    def grad(f):
        (g,) = torch.autograd.grad(f(), theta)
        return g

    def logpi():
        return torch.log_softmax(theta, 0)

    def weights():
        return logpi().exp().detach()

    out = {"KL(pi||ref)": grad(lambda: (logpi().exp() * (logpi() - log_ref)).sum()),
           "KL(ref||pi)": grad(lambda: (log_ref.exp() * (log_ref - logpi())).sum())}
    for comp in (K1(), K2(), K3()):
        def est():
            return comp.kl(logprobs=logpi().unsqueeze(0), ref_logprobs=log_ref.unsqueeze(0), response_mask=mask,
                           ratio=torch.ones(1, 4))[0]
        # loss placement: E_pi[grad k(y)] (the estimator differentiated, samples fixed)
        out[(comp.name, "loss")] = grad(lambda: (weights() * est()).sum())
        # reward placement: E_pi[k(y) grad log pi(y)] (score function, k as a constant reward)
        out[(comp.name, "reward")] = grad(lambda: (weights() * est().detach() * logpi()).sum())
    return out


def test_placement_gradients_match_the_documented_claims():
    g = exact_gradients()
    kl, rev = g["KL(pi||ref)"], g["KL(ref||pi)"]
    assert kl.abs().sum() > 1e-2 and (kl - rev).abs().sum() > 1e-2  # the checks below can fail
    assert torch.allclose(g[("k1", "reward")], kl, atol=1e-6)           # correct
    assert torch.allclose(g[("k1", "loss")], torch.zeros(4), atol=1e-7)  # E[grad log pi] = 0
    assert torch.allclose(g[("k2", "loss")], kl, atol=1e-6)             # correct
    assert not torch.allclose(g[("k2", "reward")], kl, atol=1e-3)       # biased
    assert torch.allclose(g[("k3", "loss")], rev, atol=1e-6)            # forward KL's gradient
    assert torch.allclose(g[("k3", "reward")], kl - rev, atol=1e-6)     # biased


@pytest.mark.parametrize("name, placement", [("k1", "loss"), ("k2", "reward"), ("k3", "reward")])
def test_check_warns_on_biased_combinations(name, placement):
    with pytest.warns(UserWarning, match="2506.09477"):
        policyzoo.assemble({"base": "grpo", "kl": {"use": name, "placement": placement}})


@pytest.mark.parametrize("name, placement", [("k1", "reward"), ("k2", "loss"), ("k3", "loss")])
def test_check_silent_on_sound_combinations(name, placement):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run = policyzoo.assemble({"base": "grpo", "kl": {"use": name, "placement": placement, "beta": 0.1}})
    assert run.kl.params.beta == 0.1 and run.kl.params.placement == placement


def test_defaults_and_validation():
    assert (K1().params.placement, K2().params.placement, K3().params.placement) == ("reward", "loss", "loss")
    with pytest.raises(ConfigError):
        K3(beta=-0.1)
    with pytest.raises(ConfigError) as e:
        K3(placement="advantage")
    assert "fix:" in str(e.value)
