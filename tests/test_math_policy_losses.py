"""Policy losses of the zoo (gmpo, dppo_tv, dppo_kl, dro, vespo) and the gspo_token ratio:
values and gradients worked out by hand, the assembly rules, and the contract exemption for
tokens a clip reports as cut."""

import math

import pytest
import torch

import policyzoo
from policyzoo.errors import ConfigError
from policyzoo.plugins.clip import DPPOKL, DPPOTV, DRO, GMPO, VESPO, ClipCov
from policyzoo.plugins.ratio import GSPOToken, Sequence
from policyzoo.testing.contract import run_checks


def leaf(rows):
    return torch.tensor(rows, dtype=torch.float64, requires_grad=True)


def test_gmpo_geometric_mean_of_log_space_clipped_ratios():
    # Row 0, A = +1, log r = [0.5, -0.1]: where A > 0 the clip caps log r at 0.4 -> [0.4, -0.1],
    #   mean 0.15, R = e^0.15 = 1.1618342427; row loss -1 x R on each of its 2 tokens.
    # Row 1, A = -1, log r = [-0.5, 0.3]: where A < 0 the clip floors log r at -0.4 -> [-0.4, 0.3],
    #   mean -0.05, R = e^-0.05 = 0.9512294245; row loss +R. Column 2 is padding.
    lp = leaf([[0.0, 0.0, 9.0], [0.0, 0.0, 9.0]])
    old = torch.tensor([[-0.5, 0.1, 0.0], [0.5, -0.3, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [True, True, False]])
    adv = torch.tensor([[1.0, 1.0, 0.0], [-1.0, -1.0, 0.0]], dtype=torch.float64)
    out = GMPO().clip(ratio=torch.exp(lp - old), advantages=adv, response_mask=mask)
    assert out.loss[0, :2].tolist() == pytest.approx([-1.1618342427] * 2)
    assert out.loss[1, :2].tolist() == pytest.approx([0.9512294245] * 2)
    assert out.loss[:, 2].tolist() == [0.0, 0.0]
    out.loss.sum().backward()
    # sum over the row's 2 tokens = 2 x row loss; d/d lp of the unclipped token = 2 x (-A) R / 2 = -A R;
    # the clipped token gets 0
    assert lp.grad[0].tolist() == pytest.approx([0.0, -1.1618342427, 0.0])
    assert lp.grad[1].tolist() == pytest.approx([0.0, 0.9512294245, 0.0])
    assert out.clipped_high.tolist() == [[True, False, False], [False, False, False]]
    assert out.clipped_low.tolist() == [[False, False, False], [True, False, False]]


def test_gmpo_refuses_a_sequence_ratio():
    with pytest.raises(ConfigError, match="ratio: token"):
        policyzoo.assemble({"base": "gmpo", "ratio": "sequence"})


def test_dppo_tv_bounds_the_probability_change_not_the_ratio():
    # p_old = 0.5 everywhere except the last token (0.001). A = [+1, +1, -1, -1, +1].
    # p      = [0.7, 0.6, 0.3, 0.4, 0.05]  ->  p - p_old = [0.2, 0.1, -0.2, -0.1, 0.049]
    # keep: A > 0 needs p - p_old <= 0.15 -> [no, yes, ., ., yes]; A < 0 needs >= -0.15 -> [., ., no, yes, .]
    # weight min(r, 20): r = [1.4, 1.2, 0.6, 0.8, 50 -> 20]; gradient -A w on kept tokens:
    #   [0, -1.2, 0, 0.8, -20]. The last token: ratio 50, far outside PPO's 1.2, but |dp| = 0.049.
    p = torch.tensor([[0.7, 0.6, 0.3, 0.4, 0.05]], dtype=torch.float64)
    p_old = torch.tensor([[0.5, 0.5, 0.5, 0.5, 0.001]], dtype=torch.float64)
    lp = p.log().requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, 1.0]], dtype=torch.float64)
    mask = torch.ones(1, 5, dtype=torch.bool)
    out = DPPOTV().clip(ratio=torch.exp(lp - p_old.log()), advantages=adv, logprobs=lp,
                        old_logprobs=p_old.log(), response_mask=mask)
    out.loss.sum().backward()
    assert lp.grad[0].tolist() == pytest.approx([0.0, -1.2, 0.0, 0.8, -20.0])
    assert out.clipped_high.tolist() == [[True, False, False, False, False]]
    assert out.clipped_low.tolist() == [[False, False, True, False, False]]


def test_dppo_kl_binary_kl_and_moves_back_kept():
    # p_old = 0.5. Binary KL(p_old || p) = 0.5 ln(0.5/p) + 0.5 ln(0.5/(1-p)):
    #   p = 0.7: 0.5 (-0.3364722) + 0.5 (0.5108256) = 0.0871767 > 0.05;  p = 0.6: 0.0204110 <= 0.05.
    # A = [+1, +1, -1, +1]; p = [0.7, 0.6, 0.7, 0.3]:
    #   token 0 (A > 0, p up, KL 0.087) cut; token 1 (KL 0.020) kept; token 2 (A < 0 but p above p_old:
    #   the update moves it back) kept; token 3 (A > 0, p below p_old) kept.
    p = torch.tensor([[0.7, 0.6, 0.7, 0.3]], dtype=torch.float64)
    old = torch.full((1, 4), math.log(0.5), dtype=torch.float64)
    lp = p.log().requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, -1.0, 1.0]], dtype=torch.float64)
    out = DPPOKL().clip(ratio=torch.exp(lp - old), advantages=adv, logprobs=lp, old_logprobs=old,
                        response_mask=torch.ones(1, 4, dtype=torch.bool))
    out.loss.sum().backward()
    # gradient -A r on kept tokens, r = p / 0.5 = [1.4, 1.2, 1.4, 0.6]
    assert lp.grad[0].tolist() == pytest.approx([0.0, -1.2, 1.4, -0.6])
    assert out.clipped_high.tolist() == [[True, False, False, False]]


def test_dro_value_and_gradient():
    # lp = -1, old = -1.5 (log r = 0.5), A = 2, beta 0.1:
    # loss = -A lp + beta/2 (log r)^2 = 2 + 0.05 x 0.25 = 2.0125; d/d lp = -A + beta log r = -1.95
    lp = leaf([[-1.0, 5.0]])
    out = DRO(beta=0.1).clip(advantages=torch.tensor([[2.0, 0.0]], dtype=torch.float64), logprobs=lp,
                             old_logprobs=torch.tensor([[-1.5, 0.0]], dtype=torch.float64),
                             response_mask=torch.tensor([[True, False]]))
    assert out.loss[0].tolist() == pytest.approx([2.0125, 0.0])
    out.loss.sum().backward()
    assert lp.grad[0].tolist() == pytest.approx([-1.95, 0.0])


def test_dro_requires_beta():
    with pytest.raises(ConfigError, match="beta"):
        policyzoo.assemble({"base": "grpo", "clip": "dro"})


def test_vespo_gamma_weight_by_hand():
    # Row 0, A = +1 (k 2, lambda 3), log r = [0.2, 0.1]: log w = 0.3 (a sum, not a mean),
    #   w = e^0.3 = 1.3498588, log phi = 3 + 2 x 0.3 - 3 x 1.3498588 = -0.4495764, phi = 0.6378983.
    # Row 1, A = -1 (k 3, lambda 2), log r = [-0.1]: w = 0.9048374,
    #   log phi = 2 - 0.3 - 1.8096748 = -0.1096748, phi = 0.8961255.
    # loss_t = -phi A logprobs_t, phi detached: the gradient is -phi A.
    lp = leaf([[-1.0, -2.0], [-1.0, 3.0]])
    old = torch.tensor([[-1.2, -2.1], [-0.9, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True], [True, False]])
    adv = torch.tensor([[1.0, 1.0], [-1.0, 0.0]], dtype=torch.float64)
    out = VESPO().clip(ratio=torch.exp(lp - old), advantages=adv, logprobs=lp, response_mask=mask)
    out.loss.sum().backward()
    assert lp.grad[0].tolist() == pytest.approx([-0.6378983, -0.6378983], rel=1e-6)
    assert lp.grad[1].tolist() == pytest.approx([0.8961255, 0.0], rel=1e-6)
    assert out.loss[0].tolist() == pytest.approx([0.6378983, 1.2757966], rel=1e-6)  # -phi x 1 x [-1, -2]


def test_gspo_token_value_is_the_sequence_ratio_gradient_is_per_token():
    # Row: log r = [0.3, -0.1] (mean 0.1, s = e^0.1 = 1.1051709), A per token = [2, 0].
    # sequence ratio, loss = 1/2 sum_t -A_t s: d/d lp_t = -(mean A) x s / |y| = -(1) x 1.1051709 / 2
    #   = -0.5525855 on both tokens (the mean advantage spread over the row).
    # gspo_token, loss = 1/2 sum_t -A_t s_t, d s_t / d lp_t = s: d/d lp = -A_t s / 2 = [-1.1051709, 0]
    #   (each token weighted by its own advantage). Same values, s on every token.
    old = torch.tensor([[-1.3, -0.9]], dtype=torch.float64)
    adv = torch.tensor([[2.0, 0.0]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    grads, values = {}, {}
    for comp in (Sequence(), GSPOToken()):
        lp = leaf([[-1.0, -1.0]])
        r = comp.ratio(logprobs=lp, old_logprobs=old, response_mask=mask)
        (-(adv * r).sum() / 2).backward()
        grads[comp.name], values[comp.name] = lp.grad[0].tolist(), r.detach()[0].tolist()
    assert values["sequence"] == pytest.approx([1.1051709] * 2) and values["gspo_token"] == values["sequence"]
    assert grads["sequence"] == pytest.approx([-0.5525855, -0.5525855])
    assert grads["gspo_token"] == pytest.approx([-1.1051709, 0.0])


def test_gspo_token_equals_sequence_with_a_constant_advantage():
    # A = 1.5 on both tokens: sequence gives -1.5 s / 2 per token, gspo_token -1.5 s / 2 too.
    old = torch.tensor([[-1.3, -0.9, 0.0]], dtype=torch.float64)
    adv = torch.tensor([[1.5, 1.5, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False]])
    out = []
    for comp in (Sequence(), GSPOToken()):
        lp = leaf([[-1.0, -1.0, 4.0]])
        (-(adv * comp.ratio(logprobs=lp, old_logprobs=old, response_mask=mask)).sum() / 2).backward()
        out.append(lp.grad)
    assert torch.allclose(out[0], out[1]) and out[1][0, 2] == 0.0
    assert out[1][0, 0].item() == pytest.approx(-1.5 * math.exp(0.1) / 2)


def test_a_clip_that_cuts_tokens_on_policy_passes_the_contract_when_it_reports_them():
    # Clip-Cov with a band wide enough to select tokens of the toy batch on the first update: the
    # on-policy gradient is -A except on the tokens it reports in clipped_low / clipped_high.
    result = run_checks(ClipCov, params={"select_frac": 0.5, "cov_low": -100.0, "cov_high": 100.0})
    assert all(v is None for v in result.values()), result


@pytest.mark.parametrize("spec", [
    {"base": "grpo", "clip": {"use": "dro", "beta": 0.05}},
    {"base": "grpo", "clip": "vespo", "reduce": "token_mean", "kl": None},
    {"base": "gspo", "ratio": "gspo_token"},
    {"base": "dr_grpo", "reduce": "token_sum"},
    {"base": "grpo", "clip": "dppo_kl"},
    {"base": "grpo", "kl": {"use": "k3", "straight_through": True, "clamp": 10.0, "times_ratio": True}},
], ids=str)
def test_hybrids_with_the_new_components_learn_on_the_bandit(spec, catalog):
    # 40 steps of 8 prompts x G = 8 from 2 right answers in 5 (expected reward 0.4)
    from policyzoo.testing.bandit import Bandit, bandit_run, train

    torch.manual_seed(0)
    bandit = Bandit.random(8, 5, right=2, seed=3, lr=0.05)
    history = train(bandit_run(spec, catalog), bandit, 40, prompts_per_step=8, seed=3)
    assert all(m["skipped"] == 0 and math.isfinite(m["loss"]) for m in history)
    assert history[0]["expected_reward"] < 0.5 and history[-1]["expected_reward"] > 0.6
