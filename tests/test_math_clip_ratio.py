"""Ratios and clips: hand-computed values and gradients."""

import math

import pytest
import torch

from policyzoo.errors import ConfigError
from policyzoo.plugins.clip import CISPO, NoClip, PPOClip
from policyzoo.plugins.ratio import Sequence, Token


def ones_mask(b, t):
    return torch.ones(b, t, dtype=torch.bool)


# ----------------------------------------------------------------------------- ratios
def test_token_ratio_values_mask_and_clamp():
    lp = torch.tensor([[-1.0, -2.0, 30.0, 5.0]], requires_grad=True)
    old = torch.tensor([[-1.5, -2.0, 0.0, 1.0]])
    mask = torch.tensor([[True, True, True, False]])
    r = Token().ratio(logprobs=lp, old_logprobs=old, response_mask=mask)
    # exp(0.5) = 1.648721; exp(0) = 1 exactly; log r = 30 clamped to 20 -> exp(20) = 4.851652e8;
    # masked position -> exactly 1
    assert r[0, 0].item() == pytest.approx(math.exp(0.5), rel=1e-6)
    assert r[0, 1].item() == 1.0 and r[0, 3].item() == 1.0
    assert r[0, 2].item() == pytest.approx(math.exp(20), rel=1e-5)
    r.sum().backward()
    # d exp(lp - old) / d lp = the ratio itself; 0 where clamped or masked
    assert lp.grad[0, 0].item() == pytest.approx(math.exp(0.5), rel=1e-6)
    assert lp.grad[0, 2].item() == 0.0 and lp.grad[0, 3].item() == 0.0


def test_sequence_ratio_geometric_mean_broadcast():
    # row 0: log r = [0.1, 0.3, (masked 7.0)] -> mean 0.2 -> s = exp(0.2) = 1.221403 on every column
    # row 1: no token -> s = 1
    lp = torch.tensor([[0.1, 0.3, 7.0], [4.0, 4.0, 4.0]], requires_grad=True)
    old = torch.zeros(2, 3)
    mask = torch.tensor([[True, True, False], [False, False, False]])
    s = Sequence().ratio(logprobs=lp, old_logprobs=old, response_mask=mask)
    assert torch.allclose(s[0], torch.full((3,), math.exp(0.2)))
    assert torch.equal(s[1], torch.ones(3))
    s[0, 0].backward()
    # ds/dlp_t = s / |y| = 1.221403 / 2 = 0.610701 for the two masked tokens, 0 elsewhere
    assert torch.allclose(lp.grad, torch.tensor([[math.exp(0.2) / 2, math.exp(0.2) / 2, 0.0], [0.0, 0.0, 0.0]]))


def test_gspo_finite_at_log_ratio_50():
    # log-ratios +-50 per token: mean clamped to +-10 before exp -> s = exp(10) = 22026.47 / exp(-10)
    lp = torch.tensor([[50.0, 50.0], [-50.0, -50.0], [50.0, -50.0]], requires_grad=True)
    mask = ones_mask(3, 2)
    s = Sequence().ratio(logprobs=lp, old_logprobs=torch.zeros(3, 2), response_mask=mask)
    assert s[0, 0].item() == pytest.approx(math.exp(10), rel=1e-5)
    assert s[1, 0].item() == pytest.approx(math.exp(-10), rel=1e-5)
    assert s[2, 0].item() == 1.0  # mean of +50 and -50 is 0
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0], [1.0, 1.0]])
    sur = PPOClip(eps_low=3e-4, eps_high=4e-4).clip(ratio=s, advantages=adv, response_mask=mask)
    loss = sur.loss.mean()
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(lp.grad).all()
    # row 2 (s = 1, inside the clip) keeps a gradient: its loss -A s appears on both columns and
    # ds/dlp_t = s / |y| = 0.5, so d/dlp_t = 2 x (-1 x 0.5) = -1, divided by the 6 entries of the mean
    assert torch.allclose(lp.grad[2], torch.full((2,), -1 / 6))


# ----------------------------------------------------------------------------- PPO clip
def call(comp, **kwargs):
    """Call a clip component the way pluggy does: only the arguments it declares."""
    names = comp.clip.__code__.co_varnames[1:comp.clip.__code__.co_argcount]
    return comp.clip(**{k: v for k, v in kwargs.items() if k in names})


def _grad_at(p_new, p_old, advantage, clip):
    lp = torch.tensor([[math.log(p_new)]], requires_grad=True)
    old = torch.tensor([[math.log(p_old)]])
    mask = ones_mask(1, 1)
    r = Token().ratio(logprobs=lp, old_logprobs=old, response_mask=mask)
    sur = call(clip, ratio=r, advantages=torch.tensor([[advantage]]), logprobs=lp, response_mask=mask)
    sur.loss.sum().backward()
    return lp.grad.item(), sur


@pytest.mark.parametrize("eps_high, cap", [(0.28, 0.0128), (0.2, 0.012)])
def test_clip_higher_caps_probability_rise(eps_high, cap):
    # A > 0 pushes p up while ratio p / 0.01 < 1 + eps_high; the gradient vanishes beyond, so one
    # update can raise p from 0.01 to at most 0.01 x (1 + eps_high): 0.0128 at 0.28, 0.012 at 0.2.
    clip = PPOClip(eps_low=0.2, eps_high=eps_high)
    g_below, _ = _grad_at(cap * 0.99, 0.01, 1.0, clip)
    g_above, sur = _grad_at(cap * 1.01, 0.01, 1.0, clip)
    assert g_below == pytest.approx(-0.99 * cap / 0.01, rel=1e-5)  # -A x ratio (d ratio/d lp = ratio)
    assert g_above == 0.0
    assert sur.clipped_high.item() and not sur.clipped_low.item()
    # the best surrogate reachable is A x (1 + eps_high): loss = -A x 1.28 (or 1.2) once capped
    assert sur.loss.item() == pytest.approx(-(1 + eps_high))
    # eps_high None means symmetric
    assert PPOClip(eps_low=0.2).clip(ratio=torch.tensor([[1.25]]), advantages=torch.tensor([[1.0]]),
                                     response_mask=ones_mask(1, 1)).loss.item() == pytest.approx(-1.2)


def test_ppo_clip_low_side_and_fractions_convention():
    # ratio 0.7 < 0.8 with A < 0: loss = max(0.7, 0.8) = 0.8 (capped, no grad) -> clipped_low
    # ratio 0.7 with A > 0: loss = max(-0.7, -0.8) = -0.7, grad flows -> not counted
    ratio = torch.tensor([[0.7, 0.7, 1.3, 1.3]], requires_grad=True)
    adv = torch.tensor([[-1.0, 1.0, -1.0, 1.0]])
    sur = PPOClip().clip(ratio=ratio, advantages=adv, response_mask=ones_mask(1, 4))
    assert torch.allclose(sur.loss, torch.tensor([[0.8, -0.7, 1.3, -1.2]]))
    sur.loss.sum().backward()
    assert torch.equal(ratio.grad, torch.tensor([[0.0, -1.0, 1.0, 0.0]]))
    assert sur.clipped_low.tolist() == [[True, False, False, False]]
    assert sur.clipped_high.tolist() == [[False, False, False, True]]


def test_dual_clip_noop_for_nonnegative_advantages():
    g = torch.Generator().manual_seed(0)
    ratio = torch.rand(4, 6, generator=g) * 10
    adv = torch.rand(4, 6, generator=g)
    adv[0] = 0.0
    plain = PPOClip().clip(ratio=ratio, advantages=adv, response_mask=ones_mask(4, 6))
    dual = PPOClip(dual_clip=3.0).clip(ratio=ratio, advantages=adv, response_mask=ones_mask(4, 6))
    assert torch.equal(plain.loss, dual.loss) and torch.equal(plain.clipped_high, dual.clipped_high)


def test_dual_clip_caps_negative_advantage():
    # A = -1, c = 3: ratio 5 -> max(5, 1.2) = 5 capped to min(5, 3) = 3, gradient cut;
    # ratio 2 -> max(2, 1.2) = 2 < 3, gradient d/dratio = -A = 1
    ratio = torch.tensor([[5.0, 2.0]], requires_grad=True)
    sur = PPOClip(dual_clip=3.0).clip(ratio=ratio, advantages=torch.tensor([[-1.0, -1.0]]),
                                      response_mask=ones_mask(1, 2))
    assert torch.allclose(sur.loss, torch.tensor([[3.0, 2.0]]))
    sur.loss.sum().backward()
    assert torch.equal(ratio.grad, torch.tensor([[0.0, 1.0]]))
    assert sur.clipped_high.tolist() == [[True, False]]


@pytest.mark.parametrize("bad", [{"dual_clip": 1.0}, {"dual_clip": 0.5}, {"eps_low": 1.0}, {"eps_low": -0.1},
                                 {"eps_high": -0.2}, {"epsilon": 0.2}])
def test_ppo_clip_params_validated(bad):
    with pytest.raises(ConfigError) as e:
        PPOClip(**bad)
    assert "fix:" in str(e.value)


def test_no_clip_is_reinforce():
    ratio = torch.tensor([[1.0, 3.0]], requires_grad=True)
    sur = NoClip().clip(ratio=ratio, advantages=torch.tensor([[2.0, -1.0]]))
    # loss = -A x ratio = [-2, 3]; d/dratio = -A = [-2, 1] (no clipping anywhere)
    assert torch.equal(sur.loss, torch.tensor([[-2.0, 3.0]]))
    sur.loss.sum().backward()
    assert torch.equal(ratio.grad, torch.tensor([[-2.0, 1.0]]))


# ----------------------------------------------------------------------------- CISPO
def test_cispo_passes_capped_gradient_where_ppo_passes_none():
    # p_old 0.01 -> p_new 0.1: ratio 10 > eps_high 5 -> weight 5; grad of -sg(w) A log p = -5 x A
    g_cispo, sur = _grad_at(0.1, 0.01, 1.0, CISPO())
    assert g_cispo == pytest.approx(-5.0, rel=1e-5)
    assert sur.clipped_high.item()
    g_ppo, _ = _grad_at(0.1, 0.01, 1.0, PPOClip())
    assert g_ppo == 0.0
    # ratio 2 (above PPO's 1.2, below CISPO's 5): PPO cuts, CISPO passes -2 x A
    assert _grad_at(0.02, 0.01, 1.0, CISPO())[0] == pytest.approx(-2.0, rel=1e-5)
    assert _grad_at(0.02, 0.01, 1.0, PPOClip())[0] == 0.0
    # on-policy (ratio 1) CISPO and PPO agree: -A
    assert _grad_at(0.01, 0.01, 3.0, CISPO())[0] == pytest.approx(-3.0)
    assert _grad_at(0.01, 0.01, 3.0, PPOClip())[0] == pytest.approx(-3.0)


def test_cispo_eps_high_bounds_the_weight_itself():
    # eps_high 1.5 is the weight bound (w <= 1.5), not 1 + 1.5 = 2.5:
    # ratio 1.4 -> weight 1.4 (grad -1.4); ratio 2 -> weight 1.5 (grad -1.5; an offset reading gives -2)
    clip = CISPO(eps_high=1.5)
    assert _grad_at(0.014, 0.01, 1.0, clip)[0] == pytest.approx(-1.4, rel=1e-5)
    assert _grad_at(0.02, 0.01, 1.0, clip)[0] == pytest.approx(-1.5, rel=1e-5)
    # no positive lower bound by default: ratio 0.1 keeps weight 0.1
    assert _grad_at(0.001, 0.01, 1.0, CISPO())[0] == pytest.approx(-0.1, rel=1e-5)
    # an explicit eps_low is a floor on the weight: 0.1 -> 0.5
    g, sur = _grad_at(0.001, 0.01, 1.0, CISPO(eps_low=0.5))
    assert g == pytest.approx(-0.5, rel=1e-5) and sur.clipped_low.item()


def test_cispo_weight_is_stop_gradient():
    # loss = -sg(w) A lp; if w were not detached, d/dlp would add -A lp dw/dlp = -A lp w
    lp = torch.tensor([[math.log(0.02)]], requires_grad=True)
    old = torch.tensor([[math.log(0.01)]])
    r = torch.exp(lp - old)
    CISPO().clip(ratio=r, advantages=torch.tensor([[1.0]]), logprobs=lp,
                 response_mask=ones_mask(1, 1)).loss.sum().backward()
    assert lp.grad.item() == pytest.approx(-2.0, rel=1e-5)


@pytest.mark.parametrize("bad", [{"eps_high": 0.0}, {"eps_low": 5.0}, {"eps_low": 6.0, "eps_high": 5.0}])
def test_cispo_params_validated(bad):
    with pytest.raises(ConfigError):
        CISPO(**bad)
