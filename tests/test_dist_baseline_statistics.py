"""N ranks equal one rank with the whole batch: every baseline statistic that spans more than one
group (batch whitening, a batch std, GPG's batch factor, GDPO's row whitening) goes through the
``collective``. Two gloo processes on 127.0.0.1 each get half the rows (whole groups, as the engine
splits prompts) and reduce with ``DistCollective``; one process gets the whole batch and ``LOCAL``.
"""

import pytest
import torch

import policyzoo
from policyzoo.catalog import load_catalog
from policyzoo.contract import LOCAL, Rollout, StepBatch, StepTotals
from policyzoo.step import micro_loss, prepare, step_totals
from policyzoo.testing.ranks import advantages, on_ranks

B, T = 8, 4
CASES = [
    ("batch_whiten", {}),
    ("batch_whiten", {"whiten_std": "sample", "gamma": 0.9}),
    ("gae", {"lam": 0.9}),
    ("reinforce_pp_baseline", {}),
    ("group_mean", {"whiten": True, "whiten_over": "rows"}),
    ("group_norm", {"scale": "batch"}),
    ("gpg", {}),
    ("gpg", {"alpha": "nonzero_rewards"}),
    ("gdpo", {}),
]


def batch() -> dict:
    """P = 4 prompts x G = 2 (group ids 0..3 in rank order), ragged, row 3 NaN, row 7 empty, group 2
    constant, row 6 scores 0, two reward components (weights 1 and 0.5), per-token rewards and critic values; float64.
    The halves differ (rank 1 holds the constant group), so no statistic is the same on each alone."""
    g = torch.Generator().manual_seed(3)
    lengths = torch.tensor([4, 2, 3, 1, 4, 4, 3, 0])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    parts = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, float("nan")],
                          [1.0, 0.0], [1.0, 0.0], [0.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    weights = torch.tensor([1.0, 0.5], dtype=torch.float64)
    rewards = (parts * weights).sum(-1)  # row 3: NaN (unscorable)
    token_rewards = torch.where(mask, -0.1 * torch.rand(B, T, generator=g, dtype=torch.float64), 0.0)
    token_rewards[4:7] = 0.0  # group 2 stays constant, row 6 scores exactly 0
    return dict(rewards=rewards, group_ids=torch.arange(B) // 2, response_mask=mask, token_rewards=token_rewards,
                values=torch.rand(B, T, generator=g, dtype=torch.float64),
                reward_components=parts, reward_weights=weights)


def component(name, params):
    return load_catalog(autoload=False).components["baseline"][name][0](**params)


def _half(rank, world, case):
    from policyzoo.engine.dist import DistCollective

    rows = slice(rank * B // world, (rank + 1) * B // world)
    kw = {k: (v[rows] if k != "reward_weights" else v) for k, v in batch().items()}
    out = advantages(component(*case), collective=DistCollective(), **kw)
    return out.advantages, out.returns


def _all_cases(rank, world):
    return [_half(rank, world, case) for case in CASES] + [_g1(rank, world)]


@pytest.fixture(scope="module")
def two_ranks():
    return on_ranks(_all_cases)  # one pair of processes for every case and the G = 1 step


@pytest.mark.parametrize("i", range(len(CASES)), ids=[f"{n}{p or ''}" for n, p in CASES])
def test_two_ranks_equal_one_rank(two_ranks, i):
    full = advantages(component(*CASES[i]), collective=LOCAL, **batch())
    split = torch.cat([two_ranks[0][i][0], two_ranks[1][i][0]])
    torch.testing.assert_close(split, full.advantages, atol=1e-12, rtol=1e-12)
    assert full.advantages.abs().max() > 0.1  # a real signal, not two zeros
    # each rank alone (LOCAL) would see only its rows: the statistic differs (the old bug)
    half = {k: (v[:4] if k != "reward_weights" else v) for k, v in batch().items()}
    alone = advantages(component(*CASES[i]), collective=LOCAL, **half).advantages
    assert not torch.allclose(alone, full.advantages[:4], atol=1e-6)


# ----------------------------------------------------------------------------- reinforce_pp, G = 1
def _step(rewards, lengths, collective, totals=None):
    """reinforce_pp's advantages and the gradient of its loss w.r.t. the log-probs (``totals``: the
    step's, as the engine all-reduces them; default this batch's)."""
    run = policyzoo.assemble("reinforce_pp")
    b = len(rewards)
    mask = torch.arange(3)[None, :] < torch.tensor(lengths)[:, None]
    lp = torch.full((b, 3), -1.0, dtype=torch.float64)
    rollout = Rollout(prompt_ids=[[1]] * b, response_ids=torch.ones(b, 3, dtype=torch.long), response_mask=mask,
                      rollout_logprobs=lp.clone(), group_ids=torch.arange(b),
                      truncated=torch.zeros(b, dtype=torch.bool))
    batch_, _ = prepare(run, StepBatch(rollout, torch.tensor(rewards, dtype=torch.float64)), collective=collective)
    x = lp.clone().requires_grad_(True)
    loss, _ = micro_loss(run, batch_, x, totals or step_totals(batch_), collective=collective)
    loss.backward()
    return batch_.advantages, x.grad


def _g1(rank, world):
    from policyzoo.engine.dist import DistCollective

    return _step([[1.0], [0.0]][rank], [[3], [2]][rank], DistCollective(), StepTotals(tokens=5, sequences=2))


def test_reinforce_pp_one_prompt_per_rank_trains(two_ranks):
    # Rank 0: one row, reward 1, 3 tokens; rank 1: reward 0, 2 tokens. Returns (gamma 1, no KL
    # here): [1, 1, 1] and [0, 0]; mean 3/5 = 0.6, population std sqrt(3 x 0.16 + 2 x 0.36) / 5
    # = sqrt(0.24) = 0.489898: A = 0.4 / 0.489899 = +0.816495 and -0.6 / 0.489899 = -1.224743.
    # Alone, each rank's returns are constant: A = 0 and no gradient (the bug this pins).
    adv0, grad0 = _step([1.0], [3], LOCAL)
    assert torch.equal(adv0, torch.zeros(1, 3, dtype=torch.float64)) and float(grad0.abs().max()) == 0.0
    (a0, g0), (a1, g1) = two_ranks[0][-1], two_ranks[1][-1]
    s = 0.24 ** 0.5
    assert a0[0, 0].item() == pytest.approx(0.4 / (s + 1e-6), rel=1e-9)
    assert a1[0, 0].item() == pytest.approx(-0.6 / (s + 1e-6), rel=1e-9)
    full_adv, full_grad = _step([1.0, 0.0], [3, 2], LOCAL)
    torch.testing.assert_close(torch.cat([a0, a1]), full_adv, atol=1e-12, rtol=0)
    # token_mean over the step's 5 tokens, on-policy ratio 1: d loss / d logprob = -A / 5 per token
    torch.testing.assert_close(torch.cat([g0, g1]), full_grad, atol=1e-12, rtol=0)
    assert g0[0, 0].item() == pytest.approx(-0.4 / (s + 1e-6) / 5, rel=1e-9)
