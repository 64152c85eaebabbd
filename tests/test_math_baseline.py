"""Baselines: every value below is worked out by hand in the comment next to it."""

import math

import pytest
import torch

import policyzoo
from policyzoo.contract import LOCAL, StepTotals
from policyzoo.errors import ConfigError
from policyzoo.plugins.baseline import GAE, BatchWhiten, GroupMean, GroupNorm, LeaveOneOut
from policyzoo.testing.ranks import advantages


def full_mask(b, t=3):
    return torch.ones(b, t, dtype=torch.bool)


def adv(comp, rewards, group_ids, mask=None, token_rewards=None):
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    mask = full_mask(len(rewards)) if mask is None else mask
    return advantages(comp, rewards, torch.as_tensor(group_ids), mask, token_rewards).advantages


def chained(comp, **kw):
    """The hook's result as the step uses it: then the declared composition (batch whitening)."""
    return advantages(comp, group_ids=torch.arange(len(kw["rewards"])), **kw)


R8 = [1, 0, 0, 1, 1, 0, 0, 0]


def test_group_norm_population_std():
    # mean = 3/8; population var = 3/8 - (3/8)^2 = 15/64, std = sqrt(15)/8 = 0.484123
    # correct: (1 - 0.375) / 0.484123 = +1.290994; wrong: -0.375 / 0.484123 = -0.774597
    a = adv(GroupNorm(std="population"), R8, [0] * 8)[:, 0]
    assert a[0].item() == pytest.approx(1.291, abs=5e-4)
    assert a[1].item() == pytest.approx(-0.775, abs=5e-4)
    exact = adv(GroupNorm(std="population", eps=0.0), R8, [0] * 8)[:, 0]
    assert exact[0].item() == pytest.approx(0.625 * 8 / math.sqrt(15), rel=1e-6)
    assert exact[1].item() == pytest.approx(-0.375 * 8 / math.sqrt(15), rel=1e-6)


def test_group_norm_sample_std_is_default():
    # sample var = 15/64 x 8/7 = 15/56, std = 0.517549
    # correct: 0.625 / 0.517549 = +1.207615; wrong: -0.375 / 0.517549 = -0.724569
    a = adv(GroupNorm(), R8, [0] * 8)[:, 0]
    assert a[0].item() == pytest.approx(1.208, abs=5e-4)
    assert a[1].item() == pytest.approx(-0.725, abs=5e-4)
    assert GroupNorm().params.std == "sample"


def test_advantage_broadcast_over_tokens_and_zero_on_padding():
    mask = torch.tensor([[True, True, False], [True, False, False]])
    # rewards [1, 0]: mean 0.5, sample std sqrt(0.5) = 0.707107 -> +-0.707107 (eps 0)
    a = adv(GroupNorm(eps=0.0), [1, 0], [5, 5], mask)
    h = 0.5 / math.sqrt(0.5)
    assert torch.allclose(a, torch.tensor([[h, h, 0.0], [-h, 0.0, 0.0]]))


@pytest.mark.parametrize("comp", [GroupNorm(), GroupNorm(std="population"), GroupMean(), LeaveOneOut()])
def test_all_equal_group_gives_exactly_zero(comp):
    a = adv(comp, [0.7] * 4 + [1, 0, 1, 0], [1] * 4 + [2] * 4)
    assert torch.equal(a[:4], torch.zeros(4, 3))  # exactly 0, not 1e-8
    assert (a[4:] != 0).all()


def test_near_constant_group_never_huge():
    # 0.1 + 0.2 = 0.30000000000000004 in float64: the std is a residue ~2.8e-17, far below
    # zero_std_tol 1e-6 -> exactly 0 (dividing the 4e-17 residue by ~0 + eps would give ~4e-11;
    # dividing by an unguarded residue std would give ~1.5).
    rewards = torch.tensor([0.1 + 0.2, 0.3, 0.3, 0.3], dtype=torch.float64)
    out = GroupNorm().baseline(rewards=rewards, group_ids=torch.zeros(4, dtype=torch.long),
                               response_mask=full_mask(4), token_rewards=torch.zeros(4, 3),
                               collective=LOCAL).advantages
    assert torch.equal(out, torch.zeros(4, 3, dtype=torch.float64))
    # float32 neighbours 1.0 and 1.0 + d, d = 2^-23 = 1.19e-7: mean 1 + d/4, squared deviations
    # 3 (d/4)^2 + (3d/4)^2 = 12 d^2 / 16, sample var d^2 / 4, std d/2 = 6.0e-8 <= 1e-6 -> 0
    r32 = torch.tensor([1.0, 1.0 + 2 ** -23, 1.0, 1.0], dtype=torch.float32)
    assert torch.equal(adv(GroupNorm(), r32, [0] * 4), torch.zeros(4, 3))
    # Without the tolerance the eps still bounds it: |A| = (3d/4) / (d/2 + 1e-6) = 0.084 < 0.12
    # (with neither guard it would be (3d/4) / (d/2) = 1.5)
    loose = adv(GroupNorm(zero_std_tol=0.0), r32, [0] * 4)
    assert loose.abs().max() < 0.12


def test_group_ids_not_positions_shuffled_and_uneven():
    # group 10: rewards [1, 2, 3] -> mean 2, sample std 1 -> A = [-1, 0, 1] / (1 + 1e-6)
    # group 20: [0, 0, 1, 0, 1] -> mean 0.4, sample var (3 x 0.16 + 2 x 0.36) / 4 = 0.3,
    #   std 0.547723 -> A(0) = -0.4 / 0.547723 = -0.730297, A(1) = 0.6 / 0.547723 = 1.095445
    rewards = [1, 2, 3, 0, 0, 1, 0, 1]
    ids = [10, 10, 10, 20, 20, 20, 20, 20]
    expect = torch.tensor([-1, 0, 1, -0.730297, -0.730297, 1.095445, -0.730297, 1.095445])
    sorted_adv = adv(GroupNorm(), rewards, ids)[:, 0]
    assert torch.allclose(sorted_adv, expect, atol=2e-6)
    perm = torch.tensor([5, 0, 7, 3, 1, 6, 2, 4])
    shuffled = adv(GroupNorm(), torch.tensor(rewards, dtype=torch.float32)[perm], torch.tensor(ids)[perm])[:, 0]
    assert torch.equal(shuffled, sorted_adv[perm])
    for comp in (GroupMean(), LeaveOneOut(), GroupNorm(std="population")):
        a = adv(comp, rewards, ids)[:, 0]
        b = adv(comp, torch.tensor(rewards, dtype=torch.float32)[perm], torch.tensor(ids)[perm])[:, 0]
        assert torch.equal(b, a[perm])


def test_empty_rows_and_nan_rewards_excluded_and_zero():
    # rows 2 (no token, reward 5) and 3 (NaN) are left out: valid [1, 0] -> mean 0.5,
    # sample std sqrt(0.5) -> +-0.707107. Had row 2 entered: mean 2, std 2.645751 -> -0.378.
    mask = full_mask(4)
    mask[2] = False
    rewards = torch.tensor([1.0, 0.0, 5.0, float("nan")])
    for comp, hi in ((GroupNorm(eps=0.0), 0.5 / math.sqrt(0.5)), (GroupMean(), 0.5), (LeaveOneOut(), 1.0)):
        # group_mean: 1 - 0.5 = 0.5; leave_one_out: 1 - 0 (the only other valid row) = 1
        a = adv(comp, rewards, [4, 4, 4, 4], mask)
        assert not torch.isnan(a).any()
        assert a[0, 0].item() == pytest.approx(hi, rel=1e-6)
        assert a[1, 0].item() == pytest.approx(-hi, rel=1e-6)
        assert torch.equal(a[2:], torch.zeros(2, 3))


def test_group_with_single_valid_row_gets_zero():
    rewards = torch.tensor([1.0, float("nan")])
    for comp in (GroupNorm(), GroupMean(), LeaveOneOut()):
        assert torch.equal(adv(comp, rewards, [0, 0]), torch.zeros(2, 3))


def test_group_mean_dr_grpo_and_token_rewards_enter_the_score():
    # Dr. GRPO on R8: mean 0.375 -> +0.625 / -0.375 (no std division)
    a = adv(GroupMean(), R8, [0] * 8)[:, 0]
    assert a[0].item() == pytest.approx(0.625) and a[1].item() == pytest.approx(-0.375)
    # score = reward + masked token rewards: [1 - 0.1 - 0.1, 0 - 0.3] = [0.8, -0.3] (the 9.0 is
    # on a padded position and ignored); mean 0.25 -> A = [0.55, -0.55]
    mask = torch.tensor([[True, True, False], [True, False, False]])
    tr = torch.tensor([[-0.1, -0.1, 9.0], [-0.3, 9.0, 9.0]])
    a = adv(GroupMean(), [1, 0], [0, 0], mask, tr)
    assert a[0, 0].item() == pytest.approx(0.55, abs=1e-6) and a[1, 0].item() == pytest.approx(-0.55, abs=1e-6)


def test_leave_one_out_rloo():
    # R8: a correct row sees the other 7 with 2 correct -> 1 - 2/7 = 5/7 = 0.714286;
    # a wrong row sees 3 correct of 7 -> 0 - 3/7 = -0.428571
    a = adv(LeaveOneOut(), R8, [0] * 8)[:, 0]
    assert a[0].item() == pytest.approx(5 / 7, rel=1e-6)
    assert a[1].item() == pytest.approx(-3 / 7, rel=1e-6)


@pytest.mark.parametrize("base", ["grpo", "rloo", "dr_grpo", "dapo", "gspo", "cispo"])
def test_group_baseline_rejects_g1(base):
    with pytest.raises(ConfigError) as e:
        policyzoo.assemble({"base": base, "sample": {"n": 1}})
    msg = str(e.value)
    assert "sample.n = 1" in msg and "fix:" in msg and "batch_whiten" in msg


def test_batch_whiten_reinforce_pp():
    # row 0: mask [1,1,1], R = 1, token rewards [-0.1, 0, -0.2]; row 1: mask [1,1,0], R = 0,
    # token rewards [0, -0.3, (pad 5.0 ignored)]. gamma 1, R placed on the last masked token:
    #   row 0 returns: t2 = 1 - 0.2 = 0.8, t1 = 0.8 + 0 = 0.8, t0 = 0.8 - 0.1 = 0.7
    #   row 1 returns: t1 = 0 - 0.3 = -0.3, t0 = -0.3 + 0 = -0.3
    # tokens [0.7, 0.8, 0.8, -0.3, -0.3]: mean 1.7/5 = 0.34; deviations 0.36, 0.46, 0.46, -0.64,
    # -0.64; population var (0.1296 + 2 x 0.2116 + 2 x 0.4096) / 5 = 0.2744, std 0.523832
    mask = torch.tensor([[True, True, True], [True, True, False]])
    tr = torch.tensor([[-0.1, 0.0, -0.2], [0.0, -0.3, 5.0]])
    a = chained(BatchWhiten(whiten_eps=0.0), rewards=torch.tensor([1.0, 0.0]), response_mask=mask,
                token_rewards=tr).advantages
    s = math.sqrt(0.2744)
    expect = torch.tensor([[0.36 / s, 0.46 / s, 0.46 / s], [-0.64 / s, -0.64 / s, 0.0]])
    assert torch.allclose(a, expect, atol=1e-5)
    # gamma 0.5: row 0: t2 = 0.8, t1 = 0 + 0.5 x 0.8 = 0.4, t0 = -0.1 + 0.5 x 0.4 = 0.1;
    # row 1: t1 = -0.3, t0 = 0 + 0.5 x -0.3 = -0.15. mean 0.85/5 = 0.17; deviations -0.07, 0.23,
    # 0.63, -0.32, -0.47; var (0.0049 + 0.0529 + 0.3969 + 0.1024 + 0.2209)/5 = 0.1556
    a = chained(BatchWhiten(gamma=0.5, whiten_eps=0.0), rewards=torch.tensor([1.0, 0.0]), response_mask=mask,
                token_rewards=tr).advantages
    s = math.sqrt(0.1556)
    expect = torch.tensor([[-0.07 / s, 0.23 / s, 0.63 / s], [-0.32 / s, -0.47 / s, 0.0]])
    assert torch.allclose(a, expect, atol=1e-5)


def test_batch_whiten_excludes_nan_rows_and_constant_batch_is_zero():
    mask = full_mask(3, 2)
    zeros = torch.zeros(3, 2)
    # NaN row excluded: remaining returns [1, 1] and [0, 0] -> mean 0.5, std 0.5 -> +-1
    a = chained(BatchWhiten(whiten_eps=0.0), rewards=torch.tensor([1.0, 0.0, float("nan")]), response_mask=mask,
                token_rewards=zeros).advantages
    assert torch.allclose(a, torch.tensor([[1.0, 1.0], [-1.0, -1.0], [0.0, 0.0]]))
    ones = torch.tensor([1.0, 1.0, 1.0])
    a = chained(BatchWhiten(), rewards=ones, response_mask=mask, token_rewards=zeros).advantages
    assert torch.equal(a, torch.zeros(3, 2))


def test_gae_by_hand():
    # row 0: V = [0.5, 0.4, 0.2], R = 1, token rewards [0, -0.1, 0] -> r = [0, -0.1, 1]; gamma 1, lam 0.5
    #   delta2 = 1 + 0 - 0.2 = 0.8;  delta1 = -0.1 + 0.2 - 0.4 = -0.3;  delta0 = 0 + 0.4 - 0.5 = -0.1
    #   A2 = 0.8; A1 = -0.3 + 0.5 x 0.8 = 0.1; A0 = -0.1 + 0.5 x 0.1 = -0.05; returns A + V = [0.45, 0.5, 1.0]
    # row 1: mask [1, 0, 1] (the hole is skipped), V = [0.3, (9), 0.6], R = 0.5
    #   pos2: delta = 0.5 - 0.6 = -0.1 = A; pos0: delta = 0 + 0.6 - 0.3 = 0.3, A = 0.3 + 0.5 x -0.1 = 0.25
    #   returns [0.55, 0, 0.5]
    mask = torch.tensor([[True, True, True], [True, False, True]])
    values = torch.tensor([[0.5, 0.4, 0.2], [0.3, 9.0, 0.6]])
    tr = torch.tensor([[0.0, -0.1, 0.0], [0.0, 0.0, 0.0]])
    out = chained(GAE(gamma=1.0, lam=0.5, whiten=False), rewards=torch.tensor([1.0, 0.5]), response_mask=mask,
                  token_rewards=tr, values=values)
    assert torch.allclose(out.advantages, torch.tensor([[-0.05, 0.1, 0.8], [0.25, 0.0, -0.1]]), atol=1e-6)
    assert torch.allclose(out.returns, torch.tensor([[0.45, 0.5, 1.0], [0.55, 0.0, 0.5]]), atol=1e-6)
    # whitened: tokens [-0.05, 0.1, 0.8, 0.25, -0.1], mean 0.2, deviations -0.25, -0.1, 0.6, 0.05, -0.3,
    # var 0.525 / 5 = 0.105; returns are the un-whitened targets
    w = chained(GAE(gamma=1.0, lam=0.5, whiten=True, whiten_eps=0.0), rewards=torch.tensor([1.0, 0.5]),
                response_mask=mask, token_rewards=tr, values=values)
    s = math.sqrt(0.105)
    assert torch.allclose(w.advantages, torch.tensor([[-0.25 / s, -0.1 / s, 0.6 / s], [0.05 / s, 0.0, -0.3 / s]]),
                          atol=1e-5)
    assert torch.allclose(w.returns, out.returns)


def test_gae_value_loss_clipped():
    # token 0: v 1.0, old 0.5, R 2.0: (1 - 2)^2 = 1; clipped v = 0.5 + 0.2 = 0.7: (0.7 - 2)^2 = 1.69 -> 1.69
    # token 1: v 0.4, old 0.5, R -1: (1.4)^2 = 1.96; clip leaves 0.4 -> 1.96
    # loss = 0.5 x (1.69 + 1.96) / totals.tokens (2) = 0.9125; dL/dv0 = 0 (clipped branch),
    # dL/dv1 = (0.4 + 1) / 2 = 0.7. A padded third position (garbage) adds nothing.
    v = torch.tensor([[1.0, 0.4, 50.0]], requires_grad=True)
    loss = GAE(value_clip=0.2).value_loss(values=v, old_values=torch.tensor([[0.5, 0.5, 0.0]]),
                                          returns=torch.tensor([[2.0, -1.0, 0.0]]),
                                          response_mask=torch.tensor([[True, True, False]]),
                                          totals=StepTotals(tokens=2, sequences=1))
    assert loss.item() == pytest.approx(0.9125)
    loss.backward()
    assert torch.allclose(v.grad, torch.tensor([[0.0, 0.7, 0.0]]))


def test_gae_needs_values_flag_and_params():
    assert GAE.needs_values is True
    with pytest.raises(ConfigError):
        GAE(value_clip=0.0)
    with pytest.raises(ConfigError):
        GAE(lam=1.5)


def test_advantage_bound_over_random_groups_of_every_scale():
    # the largest sample z-score in a group of G is reached by one outlier: (G-1)/sqrt(G);
    # for G = 8 that is 7 / 2.828427 = 2.474874, whatever the reward scale (1e-9 .. 1e3)
    g = torch.Generator().manual_seed(0)
    for scale in (1e-9, 1e-7, 1e-5, 1.0, 1e3):
        rewards = 0.3 + scale * torch.randn(64, generator=g, dtype=torch.float64)
        rewards[:8] = 0.3
        rewards[8:16] = torch.tensor([0.3] * 7 + [0.3 + scale], dtype=torch.float64)
        out = GroupNorm(eps=0.0, zero_std_tol=0.0).baseline(
            rewards=rewards, group_ids=torch.arange(64) // 8, response_mask=full_mask(64),
            token_rewards=torch.zeros(64, 3), collective=LOCAL).advantages
        assert out.abs().max() <= 7 / math.sqrt(8) + 1e-6
        assert out[8, 0].item() != 0 and torch.equal(out[:8], torch.zeros(8, 3, dtype=torch.float64))
    # the outlier row reaches the bound exactly (last scale, 1e3): others -1/sqrt(8), it +7/sqrt(8)
    assert out[15, 0].item() == pytest.approx(7 / math.sqrt(8), rel=1e-9)
