"""Metrics defined as the peers define them: clip_cov's and the geometric mean's clip fractions as
verl's core_algos counts them (pg_clipfrac / pg_clipfrac_lower), and the zero-std fraction under
``group_norm(scale: batch)`` as TRL's frac_reward_zero_std reports it."""

import math

import pytest
import torch

from policyzoo.contract import LOCAL
from policyzoo.plugins.baseline.group import GroupNorm
from policyzoo.plugins.clip import GMPO, ClipCov

MASK = torch.ones(2, 2, dtype=torch.bool)


def test_clip_cov_counts_the_selection_only_as_verl():
    # A = [[1, 1], [-1, -1]], logprobs [[-0.1, -2], [-0.1, -2]]: cov = [[0.95, -0.95], [-0.95, 0.95]].
    # Token (0, 0) has r = 1.5 > 1.2 with A > 0: PPO's clip takes it, so the band (0.5, 5) holds only
    # (1, 1), which select_frac 0.5 (2 of 4 tokens) cuts. verl: pg_clipfrac = mean(corr == 0) = 1/4;
    # the PPO-clipped token is not counted (it was: 2/4 before).
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
    lp = torch.tensor([[-0.1, -2.0], [-0.1, -2.0]], dtype=torch.float64)
    old = lp - torch.tensor([[math.log(1.5), 0.0], [0.0, 0.0]], dtype=torch.float64)
    out = ClipCov(select_frac=0.5, cov_low=0.5).clip(torch.exp(lp - old), adv, lp, MASK, LOCAL)
    frac = float((out.clipped_low | out.clipped_high).double().mean())
    assert frac == 0.25
    assert not out.clipped_high.any() and out.clipped_low.tolist() == [[False, False], [False, True]]


def test_gmpo_counts_every_token_outside_the_range_as_verl():
    # log r = [[0.5, -0.5], [0.5, -0.5]], eps 0.4: all four tokens lie outside [-0.4, 0.4].
    # verl: clipped = (log r != clamp(log r)); pg_clipfrac = mean(clipped & A > 0) = 2/4 (row 0),
    # pg_clipfrac_lower = mean(clipped & A < 0) = 2/4 (row 1). Counting only the side the pessimistic min
    # cuts gave 1/4 each, half of verl's.
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
    log_r = torch.tensor([[0.5, -0.5], [0.5, -0.5]], dtype=torch.float64)
    out = GMPO().clip(ratio=torch.exp(log_r), advantages=adv, response_mask=MASK)
    assert float(out.clipped_high.double().mean()) == 0.5
    assert float(out.clipped_low.double().mean()) == 0.5


@pytest.mark.parametrize("rewards, trl", [
    ([1.0, 1.0, 0.0, 1.0], 0.0),  # group 0 is constant, but the batch std (sample) is 0.5 > 0: TRL reports 0
    ([1.0, 1.0, 1.0, 1.0], 1.0),  # a constant batch: every row's std is 0
])
def test_zero_std_fraction_under_a_batch_scale_is_trls(rewards, trl):
    # TRL (scale_rewards="batch"): is_std_zero = isclose(nanstd(rewards), 0) on every row; the fraction is
    # 0 or 1. Under scale: group the group count stays (group 0 of the first batch: 1/2).
    mask = torch.ones(4, 2, dtype=torch.bool)
    ids = torch.tensor([0, 0, 1, 1])
    r = torch.tensor(rewards)
    assert GroupNorm(scale="batch").zero_std_fraction(r, ids, mask) == trl
    assert GroupNorm().zero_std_fraction(r, ids, mask) == (0.5 if trl == 0.0 else 1.0)
