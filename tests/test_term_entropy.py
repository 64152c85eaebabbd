"""Additive loss terms (the ``term`` slot): the entropy bonus by hand, its gradient reaching the policy
only when a term asks for it, the adaptive entropy controller (Skywork-OR1 / TRL use_adaptive_entropy)
by hand and on two ranks, and the KL in loss placement as the first additive term."""

import math

import pytest
import torch

import policyzoo
from policyzoo.contract import LOCAL, Rollout, StepBatch, StepTotals
from policyzoo.plugins.term import EntropyAdaptive
from policyzoo.step import micro_loss, prepare
from policyzoo.step.loss import loss_terms
from policyzoo.testing.bandit import Bandit, bandit_run, train
from policyzoo.testing.ranks import on_ranks

NO_KL = {"base": "grpo", "kl": None}


def _batch():
    mask = torch.tensor([[True, True, False], [True, False, False]])
    rollout = Rollout(prompt_ids=[[1]] * 2, response_ids=torch.ones(2, 3, dtype=torch.long), response_mask=mask,
                      rollout_logprobs=torch.full((2, 3), -1.0), group_ids=torch.tensor([0, 0]),
                      truncated=torch.zeros(2, dtype=torch.bool))
    return rollout, mask


def test_entropy_bonus_by_hand():
    rollout, mask = _batch()
    ent = torch.tensor([[0.6, 0.2, 9.0], [1.0, 9.0, 9.0]], requires_grad=True)  # 9.0: padding, never counted
    lp = torch.full((2, 3), -1.0, requires_grad=True)
    totals = StepTotals(tokens=3, sequences=2, rows=2)
    plain = policyzoo.assemble(NO_KL)
    bonus = policyzoo.assemble({**NO_KL, "term": [{"use": "entropy", "coef": 0.5}]})
    base, _ = micro_loss(plain, prepare(plain, StepBatch(rollout, torch.tensor([1.0, 0.0])))[0], lp, totals, ent)
    batch, _ = prepare(bonus, StepBatch(rollout, torch.tensor([1.0, 0.0])))
    loss, sums = micro_loss(bonus, batch, lp, totals, ent)
    # grpo's reduce (seq_mean_token_mean): row means of H = (0.6 + 0.2) / 2 = 0.4 and 1.0, mean 0.7;
    # the term is -H, so the loss moves by 0.5 x (-0.7) = -0.35
    assert float((loss - base).detach()) == pytest.approx(-0.35, abs=1e-6)
    assert sums["term/entropy"] == (pytest.approx(-1.8), 3.0)  # the unscaled term's sum over the 3 tokens
    (g,) = torch.autograd.grad(loss, ent)
    # d loss / d H = -0.5 x (1/2 per row) x (1/len): row 0 tokens -0.125 each, row 1 -0.25, padding 0
    assert torch.allclose(g, torch.tensor([[-0.125, -0.125, 0.0], [-0.25, 0.0, 0.0]]))


def test_kl_in_loss_is_the_first_additive_term():
    rollout, mask = _batch()
    run = policyzoo.assemble({"base": "grpo", "kl": {"use": "k2", "beta": 0.1}, "term": [{"use": "entropy"}]})
    lp = torch.full((2, 3), -1.0)
    batch = StepBatch(rollout, torch.tensor([1.0, 0.0]), ref_logprobs=torch.full((2, 3), -1.5))
    terms = loss_terms(run, batch, lp, torch.ones(2, 3), torch.ones(2, 3))
    assert [(k, c) for k, c, _ in terms] == [("kl_loss", 0.1), ("term/entropy", 0.001)]
    # k2 = (log r)^2 / 2 = 0.5^2 / 2 = 0.125 on valid tokens
    assert torch.equal(terms[0][2], torch.where(mask, 0.125, 0.0))


def _one_question(coef=None):
    # p = softmax([0, ln 3]) = [0.25, 0.75]; both answers right, so every advantage is 0 and only the
    # entropy term moves the weights
    bandit = Bandit([[1, 1]], [[True, True]], logits=[[0.0, math.log(3.0)]], lr=1.0, optimizer="sgd")
    algo = NO_KL if coef is None else {**NO_KL, "term": [{"use": "entropy", "coef": coef}]}
    return bandit, bandit_run(algo)


def test_entropy_gradient_reaches_the_policy_only_when_a_term_asks():
    bandit, _ = _one_question()
    rollout = bandit.generate(bandit.prompts(1), n=2, max_tokens=4, temperature=1.0, seed=0)
    _, ent = bandit.logprobs(rollout, grad=True, entropy=True)
    assert not ent.requires_grad  # the metric alone: no graph
    _, ent = bandit.logprobs(rollout, grad=True, entropy=True, entropy_grad=True)
    assert ent.requires_grad

    bandit, run = _one_question(coef=0.5)
    train(run, bandit, steps=1, prompts_per_step=2)
    # H = 0.25 ln 4 + 0.75 ln(4/3) = 0.562335; dH/dtheta_k = -p_k (ln p_k + H):
    # k=0: -0.25 (-1.386294 + 0.562335) = 0.205990, k=1: -0.205990. The loss is -0.5 H (one token per row),
    # so SGD (lr 1) moves theta by +0.5 dH/dtheta: [0.102995, ln 3 - 0.102995 = 0.995617]
    assert torch.allclose(bandit.theta.detach(), torch.tensor([[0.102995, 0.995617]]), atol=1e-5)
    plain, run = _one_question()
    train(run, plain, steps=1, prompts_per_step=2)
    assert torch.equal(plain.theta.detach(), torch.tensor([[0.0, math.log(3.0)]]))  # no term: nothing moves


def test_adaptive_entropy_by_hand():
    c = EntropyAdaptive(coef=0.01, target=0.5, delta=0.005, coef_max=0.02)
    assert c.stateful and c.coef == 0.0  # no entropy measured yet (TRL: last entropy inf): no bonus
    c.update({"entropy": 0.4, "tokens": 10})  # 0.4 <= 0.5: 0.01 + 0.005 = 0.015, applied
    assert c.coef == pytest.approx(0.015)
    c.update({"entropy": 0.6, "tokens": 10})  # above: 0.015 - 0.005 = 0.01, and not applied (0.6 > 0.5)
    assert c.coef == 0.0 and c.state_dict() == {"coef": pytest.approx(0.01), "last_entropy": 0.6}
    c.update({"entropy": 0.45, "tokens": 10})  # 0.015
    c.update({"entropy": 0.45, "tokens": 10})  # 0.02 = coef_max
    c.update({"entropy": 0.45, "tokens": 10})  # min(0.025, 0.02) = 0.02
    assert c.coef == pytest.approx(0.02)
    again = EntropyAdaptive(coef=0.01, target=0.5, delta=0.005, coef_max=0.02)
    again.load_state_dict(c.state_dict())
    assert again.coef == c.coef and again.state_dict() == c.state_dict()


def _entropy_on_rank(rank, world):
    from policyzoo.engine.dist import DistCollective

    c = EntropyAdaptive(coef=0.01, target=0.5, delta=0.005)
    # rank 0: 10 tokens of mean entropy 0.3; rank 1: 30 tokens of 0.7 -> (3 + 21) / 40 = 0.6 > 0.5: decrease
    c.update({"entropy": [0.3, 0.7][rank], "tokens": [10, 30][rank]}, DistCollective())
    return c.state_dict()


def test_two_ranks_compute_the_same_entropy_coefficient():
    a, b = on_ranks(_entropy_on_rank, world=2)
    assert a == b
    assert a["coef"] == pytest.approx(0.005) and a["last_entropy"] == pytest.approx(0.6)
    alone = EntropyAdaptive(coef=0.01, target=0.5, delta=0.005)
    alone.update({"entropy": 0.3, "tokens": 10}, LOCAL)  # rank 0 alone would have increased it
    assert alone.state_dict()["coef"] == pytest.approx(0.015)


def test_adaptive_entropy_state_goes_into_the_run_state():
    run = policyzoo.assemble({**NO_KL, "term": [{"use": "entropy"}, {"use": "entropy_adaptive", "coef": 0.1}]})
    assert run.state_dict() == {"term[1]:entropy_adaptive": {"coef": 0.1, "last_entropy": None}}
    run.load_state_dict({"term[1]:entropy_adaptive": {"coef": 0.3, "last_entropy": 0.1}})
    assert run.term[1].coef == 0.3


def test_engine_token_logprobs_entropy_has_grad_only_when_asked():
    from policyzoo.engine.trainer.prefix import token_logprobs

    # one position, logits [0, ln 3] at temperature 1: p = [0.25, 0.75], H = 0.562335 (as above);
    # dH/dz = -p (ln p + H) = [0.205990, -0.205990]
    logits = torch.tensor([[[0.0, math.log(3.0)]]], requires_grad=True)
    lp, ent = token_logprobs(logits, torch.tensor([[1]]), 1.0, True)
    assert not ent.requires_grad and float(ent) == pytest.approx(0.562335, abs=1e-6)
    lp2, ent2 = token_logprobs(logits, torch.tensor([[1]]), 1.0, True, entropy_grad=True)
    assert torch.equal(lp, lp2) and float(ent2) == pytest.approx(float(ent), abs=1e-7)
    (g,) = torch.autograd.grad(ent2.sum(), logits)
    assert torch.allclose(g, torch.tensor([[[0.205990, -0.205990]]]), atol=1e-5)
