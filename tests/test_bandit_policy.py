"""The bandit test bed as a Policy: shapes, the token model, truncation, seeds, sync, errors.

Values are worked out by hand from the model in policyzoo.testing.bandit's docstring: the first token
carries log softmax(theta / temperature)[k], every later token log-prob 0.
"""

import math

import pytest
import torch

from policyzoo.contract import Policy
from policyzoo.errors import ConfigError, DataError
from policyzoo.testing.bandit import Bandit, BanditCorrect

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def small(**kw):
    # one question, three candidates: right (4 tokens), wrong (18 tokens), wrong (2 tokens)
    return Bandit([[4, 18, 2]], [[True, False, False]], **kw)


def test_implements_the_policy_protocol():
    assert isinstance(small(), Policy)


def test_rollout_layout_and_token_model():
    b = small()
    r = b.generate(b.prompts(2), n=5, max_tokens=32, temperature=1.0, seed=0)
    # B = 2 prompts x 5; T = max length 18 (below max_tokens)
    assert r.response_ids.shape == (10, 18) and r.response_mask.shape == (10, 18)
    k = r.response_ids[:, 0]
    # the mask is True on exactly L_k tokens, left-aligned
    want_len = torch.tensor([4, 18, 2])[k]
    assert torch.equal(r.response_mask.sum(-1), want_len)
    assert torch.equal(r.response_mask, torch.arange(18)[None] < want_len[:, None])
    # uniform logits: the choice token has log(1/3) = -1.0986..., every later token exactly 0
    lp, ent = b.logprobs(r, grad=True, entropy=True)
    assert torch.allclose(lp[:, 0], torch.full((10,), -math.log(3)))
    assert torch.equal(lp[:, 1:], torch.zeros(10, 17))
    assert torch.allclose(r.rollout_logprobs, lp.detach())
    # entropy of a uniform 3-way choice = log 3 on the first token, 0 on deterministic tokens
    assert torch.allclose(ent[:, 0], torch.full((10,), math.log(3))) and torch.equal(ent[:, 1:], torch.zeros(10, 17))
    assert lp.requires_grad and not b.logprobs(r, grad=False)[0].requires_grad
    # groups: 5 rows per prompt, ids unique across calls
    assert r.group_ids.tolist() == [0] * 5 + [1] * 5
    r2 = b.generate(b.prompts(1), n=2, max_tokens=32, temperature=1.0, seed=1)
    assert r2.group_ids.tolist() == [2, 2]


def test_truncation_cuts_at_max_tokens():
    b = Bandit([[18]], [[True]])
    r = b.generate(b.prompts(1), n=2, max_tokens=6, temperature=1.0, seed=0)
    # an 18-token answer under a 6-token limit: width 6, all 6 tokens masked in, flagged truncated
    assert r.response_mask.shape == (2, 6) and bool(r.response_mask.all())
    assert r.truncated.tolist() == [True, True]
    # a truncated response never reaches its answer: bandit_correct scores it 0, not 1
    assert BanditCorrect().reward(r).tolist() == [0.0, 0.0]


def test_temperature_scales_the_logits():
    b = Bandit([[1, 1]], [[True, False]], logits=[[1.0, 0.0]])
    r = b.generate(b.prompts(1), n=4, max_tokens=4, temperature=2.0, seed=0)
    lp = b.logprobs(r, grad=False)[0][:, 0]
    # softmax([0.5, 0]): log p0 = 0.5 - log(e^0.5 + 1) = 0.5 - 0.974077 = -0.474077
    #                    log p1 = -0.974077
    want = torch.where(r.response_ids[:, 0] == 0, torch.tensor(-0.474077), torch.tensor(-0.974077))
    assert torch.allclose(lp, want, atol=1e-5)


def test_seeds_reproduce_everything():
    runs = []
    for _ in range(2):
        b = Bandit.random(5, 4, right=2, seed=3)
        r = b.generate(b.prompts(4), n=3, max_tokens=8, temperature=1.0, seed=11)
        runs.append((b.lengths, r.response_ids, r.response_mask, [p["question"] for p in r.rows]))
    for x, y in zip(*runs):
        assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
    b = Bandit.random(5, 4, right=2, seed=3)
    other = b.generate(b.prompts(4), n=3, max_tokens=8, temperature=1.0, seed=12)
    assert not torch.equal(other.response_ids, runs[0][1])


def test_random_bandit_starts_at_right_over_candidates():
    b = Bandit.random(10, 5, right=2)
    # uniform logits: accuracy = 2 right of 5 = 0.4 for every question
    assert b.accuracy() == pytest.approx(0.4) and b.expected_reward() == pytest.approx(0.4)
    assert b.scores.sum(-1).tolist() == [2.0] * 10


def test_sampler_is_stale_until_sync_and_reference_stays_frozen():
    b = small(optimizer="sgd", lr=1.0)
    r = b.generate(b.prompts(1), n=1, max_tokens=32, temperature=1.0, seed=0)
    lp = b.logprobs(r, grad=True)[0]
    b.backward(-lp[:, 0].sum())
    out = b.optimizer_step()
    k = int(r.response_ids[0, 0])
    # d/dtheta of -log softmax(theta)[k] at uniform = p - onehot(k) = 1/3 - 1[j=k];
    # SGD lr 1: theta_k += 2/3, others -= 1/3; |grad| = sqrt(4/9 + 1/9 + 1/9) = sqrt(6)/3
    want = torch.full((3,), -1 / 3)
    want[k] = 2 / 3
    assert torch.allclose(b.theta.detach()[0], want) and out["grad_norm"] == pytest.approx(math.sqrt(6) / 3)
    assert torch.equal(b.sampler_theta, torch.zeros(1, 3))  # not yet pushed to the sampler
    assert torch.equal(b.ref_logprobs(r)[:, 0], torch.tensor([-math.log(3)]))
    assert b.sync()["sync_max_change"] == pytest.approx(2 / 3)
    assert torch.equal(b.sampler_theta, b.theta.detach())
    assert torch.equal(b.ref_theta, torch.zeros(1, 3))


def test_non_finite_gradient_skips_the_step():
    b = small(optimizer="sgd", lr=1.0)
    r = b.generate(b.prompts(1), n=2, max_tokens=32, temperature=1.0, seed=0)
    b.backward(b.logprobs(r, grad=True)[0].sum() * float("nan"))
    assert b.optimizer_step()["skipped"] == 1
    assert torch.equal(b.theta.detach(), torch.zeros(1, 3)) and b.theta.grad is None


def test_tabular_critic_one_value_per_question_and_position():
    b = Bandit([[3, 5], [2, 2]], [[1, 0], [0, 1]], optimizer="sgd", critic_lr=0.5)
    with torch.no_grad():
        b.critic.copy_(torch.arange(10.0).reshape(2, 5))
    r = b.generate([{"question": 1, "prompt": "q1", "scores": [0, 1]}], n=2, max_tokens=9, temperature=1.0, seed=0)
    v = b.values(r, grad=False)
    assert v.shape == (2, 5) and torch.equal(v, torch.tensor([[5.0, 6, 7, 8, 9]] * 2))
    # value loss = sum of the gathered values; SGD lr 0.5 on V[1, t]: each is read twice -> -1.0
    b.backward(torch.zeros((), requires_grad=True), b.values(r, grad=True).sum())
    b.optimizer_step()
    assert torch.equal(b.critic.detach()[1], torch.tensor([4.0, 5, 6, 7, 8]))
    assert torch.equal(b.critic.detach()[0], torch.arange(5.0))


def test_nan_scores_are_unscorable_rewards():
    b = Bandit([[1, 1, 1]], scores=[[1.0, 0.0, float("nan")]])
    r = b.generate(b.prompts(1), n=30, max_tokens=4, temperature=1.0, seed=0)
    rew = BanditCorrect().reward(r)
    k = r.response_ids[:, 0]
    assert torch.equal(torch.isnan(rew), k == 2) and torch.equal(rew[k == 0], torch.ones(int((k == 0).sum())))
    # NaN scores count 0 in expected_reward: (1 + 0 + 0) / 3
    assert b.expected_reward() == pytest.approx(1 / 3)


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(lengths=[[1, 2]], correct=[[1]]), "table shapes differ"),
    (dict(lengths=[[0, 2]], correct=[[1, 0]]), "fewer than 1 token"),
    (dict(lengths=[1, 2], correct=[1, 0]), "[M, K] table"),
    (dict(lengths=[[1, 2]], correct=[[1, 0]], optimizer="rmsprop"), "optimizer"),
    (dict(lengths=[[1, 2]]), "neither correct nor scores"),
])
def test_malformed_tables_raise_config_errors(kwargs, fragment):
    with pytest.raises(ConfigError) as e:
        Bandit(**kwargs)
    assert fragment in str(e.value) and "fix:" in str(e.value)


def test_skip_discards_gradients_and_keeps_optimizer_state():
    b = small(optimizer="adam", lr=0.1)
    r = b.generate(b.prompts(1), n=4, max_tokens=32, temperature=1.0, seed=0)
    b.backward(-b.logprobs(r, grad=True)[0].sum())
    assert b.optimizer_step(skip=True) == {"skipped": 1}
    assert torch.equal(b.theta.detach(), torch.zeros(1, 3)) and b.theta.grad is None
    assert len(b.opt.state) == 0  # Adam never stepped: no moments were written


@pytest.mark.parametrize("row", [{"prompt": "What is 2 + 2?"}, {"prompt": "q", "question": 3}])
def test_rows_without_a_question_id_raise_data_errors(row):
    with pytest.raises(DataError) as e:
        small().generate([row], n=2, max_tokens=8, temperature=1.0, seed=0)
    assert "no question id in 0..0" in str(e.value) and "Bandit.prompts" in str(e.value)
