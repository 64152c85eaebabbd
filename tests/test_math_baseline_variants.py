"""The zoo's advantage variants and the baseline composition, worked out by hand (arithmetic in the
comment next to each value). Components are called as the step calls them: the hook, then the
declared composition (``policyzoo.testing.ranks.advantages``)."""

import math

import pytest
import torch

import policyzoo
from policyzoo.errors import ConfigError
from policyzoo.plugins.baseline import (
    GDPO,
    GPG,
    OPO,
    BatchWhiten,
    GroupMean,
    GroupNorm,
    GRPOPassK,
    LeaveOneOut,
    OptimalTokenBaseline,
    ReinforcePPBaseline,
    ReMax,
    TIROptimalTokenBaseline,
)
from policyzoo.testing.ranks import advantages


def mask_of(lengths, t=None):
    t = t or max(lengths)
    return torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]


def adv(comp, rewards, groups, lengths=None, **kw):
    r = torch.tensor(rewards, dtype=torch.float64)
    m = mask_of(lengths or [1] * len(rewards))
    return advantages(comp, r, torch.tensor(groups), m, **kw).advantages


def first(a):
    """Each row's advantage (its first token)."""
    return a[:, 0].tolist()


# ----------------------------------------------------------------------------- composition
def test_reinforce_pp_baseline_group_mean_then_token_whitening():
    # groups [1, 0] and [0, 0], lengths [2, 1, 1, 2]: centred [0.5, -0.5, 0, 0]; over the 6 tokens
    # [.5, .5, -.5, 0, 0, 0]: mean 1/12, deviations 5/12 (x2), -7/12, -1/12 (x3), ssd 102/144,
    # population var 102/864, std 0.343592 -> 1.212678, -1.697749, -0.242536, -0.242536
    a = adv(ReinforcePPBaseline(whiten_eps=0.0), [1, 0, 0, 0], [0, 0, 1, 1], [2, 1, 1, 2])
    assert first(a) == pytest.approx([1.212678, -1.697749, -0.242536, -0.242536], abs=1e-6)
    assert a[0, 1] == a[0, 0] and a[1, 1] == 0.0  # broadcast over the row's tokens, 0 on padding
    # the same as group_mean with whiten: true -- the composition, not a new rule
    same = adv(GroupMean(whiten=True, whiten_eps=0.0), [1, 0, 0, 0], [0, 0, 1, 1], [2, 1, 1, 2])
    assert torch.equal(a, same)


def test_reinforce_pp_baseline_groups_of_one_give_whitened_rewards():
    # G = 1 (singleton: reward, as verl): centred = r = [1, 0, 0.5]; mean 0.5, population std
    # sqrt((0.25 + 0.25 + 0) / 3) = 0.408248 -> [1.224745, -1.224745, 0]
    a = adv(ReinforcePPBaseline(whiten_eps=0.0), [1, 0, 0.5], [0, 1, 2])
    assert first(a) == pytest.approx([1.224745, -1.224745, 0.0], abs=1e-6)
    policyzoo.assemble({"base": "reinforce_pp_baseline", "sample": {"n": 1}})  # allowed
    with pytest.raises(ConfigError, match="singleton: reward"):
        policyzoo.assemble({"base": "grpo", "sample": {"n": 1}, "baseline": {"use": "group_mean"}})


def test_whiten_over_rows_weighs_each_row_once():
    # group_mean on one group [1, 0], lengths [3, 1]: centred [0.5, -0.5].
    # rows: mean 0, population std 0.5 -> [+1, -1].
    # tokens [.5, .5, .5, -.5]: mean 0.25, ssd 3 x 0.0625 + 0.5625 = 0.75, std sqrt(0.1875) = 0.433013
    #   -> 0.25 / 0.433013 = 0.577350, -0.75 / 0.433013 = -1.732051
    rows = adv(GroupMean(whiten=True, whiten_over="rows", whiten_eps=0.0), [1, 0], [0, 0], [3, 1])
    toks = adv(GroupMean(whiten=True, whiten_eps=0.0), [1, 0], [0, 0], [3, 1])
    assert first(rows) == pytest.approx([1.0, -1.0], abs=1e-9)
    assert first(toks) == pytest.approx([0.577350, -1.732051], abs=1e-6)


def test_whiten_std_switch_population_or_sample():
    # batch_whiten's hand example (test_math_baseline): 5 token returns, ssd 0.2744 x 5 = 1.372;
    # deviation of row 0 token 0 is 0.36. population std sqrt(0.2744) = 0.523832 -> 0.687242;
    # sample std sqrt(1.372 / 4) = 0.585662 -> 0.614689 (verl masked_whiten's unbiased variance)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    tr = torch.tensor([[-0.1, 0.0, -0.2], [0.0, -0.3, 5.0]])
    r = torch.tensor([1.0, 0.0])
    pop = advantages(BatchWhiten(whiten_eps=0.0), r, torch.arange(2), mask, tr).advantages
    smp = advantages(BatchWhiten(whiten_eps=0.0, whiten_std="sample"), r, torch.arange(2), mask, tr).advantages
    assert pop[0, 0].item() == pytest.approx(0.36 / math.sqrt(0.2744), rel=1e-5)
    assert smp[0, 0].item() == pytest.approx(0.36 / math.sqrt(1.372 / 4), rel=1e-5)
    assert BatchWhiten().params.whiten_std == "population"  # the default stays as it was


def test_batch_whiten_without_whitening_is_the_returns():
    # whiten: false leaves the token returns: row 0 [0.7, 0.8, 0.8], row 1 [-0.3, -0.3, 0]
    mask = torch.tensor([[True, True, True], [True, True, False]])
    tr = torch.tensor([[-0.1, 0.0, -0.2], [0.0, -0.3, 5.0]])
    a = advantages(BatchWhiten(whiten=False), torch.tensor([1.0, 0.0]), torch.arange(2), mask, tr).advantages
    assert torch.allclose(a, torch.tensor([[0.7, 0.8, 0.8], [-0.3, -0.3, 0.0]]), atol=1e-6)


# ----------------------------------------------------------------------------- group variants
def test_group_norm_batch_std_trl_scale_rewards_batch():
    # groups [1, 0] and [1, 1]: centred [0.5, -0.5, 0, 0]; batch [1, 0, 1, 1]: mean 0.75,
    # ssd 3 x 0.0625 + 0.5625 = 0.75; sample std sqrt(0.25) = 0.5 -> [+1, -1, 0, 0];
    # population std sqrt(0.1875) = 0.433013 -> +-1.154701
    a = adv(GroupNorm(scale="batch", eps=0.0), [1, 0, 1, 1], [0, 0, 1, 1])
    assert first(a) == pytest.approx([1.0, -1.0, 0.0, 0.0], abs=1e-9)
    p = adv(GroupNorm(scale="batch", std="population", eps=0.0), [1, 0, 1, 1], [0, 0, 1, 1])
    assert first(p) == pytest.approx([1.154701, -1.154701, 0.0, 0.0], abs=1e-6)
    # with the group std instead: group 0 [1, 0] has sample std 0.707107 -> +-0.707107
    assert first(adv(GroupNorm(eps=0.0), [1, 0, 1, 1], [0, 0, 1, 1])) == pytest.approx([0.707107, -0.707107, 0, 0],
                                                                                           abs=1e-6)
    assert torch.equal(adv(GroupNorm(scale="batch"), [2, 2, 2, 2], [0, 0, 1, 1]), torch.zeros(4, 1,
                                                                                                dtype=torch.float64))


def test_opo_length_weighted_baseline():
    # rewards [1, 0, 1], lengths [1, 3, 2]: b = (1 x 1 + 3 x 0 + 2 x 1) / 6 = 0.5 -> [0.5, -0.5, 0.5]
    # (the plain group mean would be 2/3)
    assert first(adv(OPO(), [1, 0, 1], [0, 0, 0], [1, 3, 2])) == pytest.approx([0.5, -0.5, 0.5], abs=1e-12)


def test_gpg_batch_factor():
    # group 0 [1, 0], group 1 [1, 1] (constant). valid_rows: B = 4, M = 2 rows of constant groups,
    # alpha = 4 / 2 = 2 -> group 0: 2 x (+-0.5) = +-1; group 1: 0.
    # nonzero_rewards (verl): 3 rows score != 0 -> alpha = 4/3 -> +-0.666667. f_norm 2 halves it.
    assert first(adv(GPG(), [1, 0, 1, 1], [0, 0, 1, 1])) == pytest.approx([1, -1, 0, 0], abs=1e-12)
    assert first(adv(GPG(alpha="nonzero_rewards"), [1, 0, 1, 1], [0, 0, 1, 1])) == pytest.approx(
        [2 / 3, -2 / 3, 0, 0], abs=1e-12)
    assert first(adv(GPG(f_norm=2.0), [1, 0, 1, 1], [0, 0, 1, 1])) == pytest.approx([0.5, -0.5, 0, 0], abs=1e-12)


def test_grpo_passk_credits_only_the_best_row():
    # group [0.2, 0.9, 0.5, 0.1]: best row 1, 0.9 - 0.5 = 0.4; sample std: mean 0.425, deviations
    # -0.225, 0.475, 0.075, -0.325, ssd 0.3875, var 0.129167, std 0.359398 -> 0.4 / 0.359398 = 1.112973
    # group [1, 1, 0]: the top two tie -> 0 everywhere
    a = adv(GRPOPassK(eps=0.0), [0.2, 0.9, 0.5, 0.1, 1, 1, 0], [0, 0, 0, 0, 1, 1, 1])
    assert first(a) == pytest.approx([0, 1.112973, 0, 0, 0, 0, 0], abs=1e-6)
    raw = adv(GRPOPassK(norm_by_std=False), [0.2, 0.9, 0.5, 0.1], [0, 0, 0, 0])
    assert first(raw) == pytest.approx([0, 0.4, 0, 0], abs=1e-12)


def test_groups_of_one_switch():
    # singleton: zero (default) gives 0; reward gives the score against a baseline of 0, as verl:
    # group_norm r / (1 + eps) (mean 0, std 1), group_mean and leave_one_out r
    assert first(adv(GroupNorm(), [2.0], [0])) == [0.0]
    assert first(adv(GroupNorm(singleton="reward"), [2.0], [0])) == pytest.approx([2 / (1 + 1e-6)], rel=1e-12)
    assert first(adv(GroupMean(singleton="reward"), [2.0, 1.0, 0.0], [0, 1, 1])) == pytest.approx([2.0, 0.5, -0.5])
    assert first(adv(LeaveOneOut(singleton="reward"), [2.0], [0])) == [2.0]
    policyzoo.assemble({"base": "rloo", "sample": {"n": 1}, "baseline": {"singleton": "reward"}})


# ----------------------------------------------------------------------------- multi-reward
def gdpo(rewards, parts, groups, **params):
    r = torch.tensor(rewards, dtype=torch.float64)
    return advantages(GDPO(whiten_eps=0.0, eps=0.0, **params), r, torch.tensor(groups), mask_of([1] * len(r)),
                      reward_components=torch.tensor(parts, dtype=torch.float64),
                      reward_weights=torch.tensor([1.0, 0.5], dtype=torch.float64)).advantages


def test_gdpo_normalises_each_reward_then_whitens_rows():
    # weights [1, 0.5]; group 0: components [1, 0], [0, 1]; group 1: [1, 1], [1, 0].
    # component 0: group 0 [1, 0] -> +-0.707107 (sample std 0.707107); group 1 [1, 1] constant -> 0.
    # component 1: group 0 [0, 1] -> -+0.707107; group 1 [1, 0] -> +-0.707107.
    # weighted sums a = 0.707107 - 0.353553 = 0.353553: [a, -a, 0.5 x 0.707107 = a, -a];
    # rows: mean 0, sample std a x 2 / sqrt(3) -> +-sqrt(3)/2 = +-0.866025
    a = gdpo([1, 0.5, 1.5, 1], [[1, 0], [0, 1], [1, 1], [1, 0]], [0, 0, 1, 1])
    assert first(a) == pytest.approx([0.866025, -0.866025, 0.866025, -0.866025], abs=1e-6)


def test_gdpo_component_nan_adds_nothing():
    # row 3 component 1 is NaN (its summed reward is scorable, e.g. under TRL's nansum): component 1
    # of group 1 has one scored row -> adds 0; component 0 of group 1 [1, 1] constant -> 0.
    # totals [a, -a, 0, 0], a = 0.353553: sample std of the rows a sqrt(2/3) -> +-1.224745, 0, 0.
    a = gdpo([1, 0.5, 1.5, 1], [[1, 0], [0, 1], [1, 1], [1, float("nan")]], [0, 0, 1, 1])
    assert first(a) == pytest.approx([1.224745, -1.224745, 0, 0], abs=1e-6)
    # an unscorable row (summed reward NaN) gets 0 and leaves every statistic: group 1 keeps one
    # valid row (0); rows [a, -a, 0]: sample std sqrt(2 a^2 / 2) = a -> +-1, 0, 0
    b = gdpo([1, 0.5, 1.5, float("nan")], [[1, 0], [0, 1], [1, 1], [1, float("nan")]], [0, 0, 1, 1])
    assert first(b) == pytest.approx([1.0, -1.0, 0.0, 0.0], abs=1e-9)


# ----------------------------------------------------------------------------- remax
def test_remax_returns_minus_the_greedy_reward():
    # row 0: R = 1, 2 tokens, no token rewards: returns [1, 1] - 0.5 = [0.5, 0.5]
    # row 1: R = 0, token rewards [-0.1, 0, -0.2]: returns t2 = -0.2, t1 = -0.2, t0 = -0.3; - 0.5
    #   -> [-0.8, -0.7, -0.7]. row 2: greedy reward NaN (unscorable) -> 0
    mask = mask_of([2, 3, 1])
    tr = torch.tensor([[0.0, 0.0, 9.0], [-0.1, 0.0, -0.2], [0.0, 0.0, 0.0]], dtype=torch.float64)
    out = advantages(ReMax(), torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64), torch.arange(3), mask, tr,
                     greedy_rewards=torch.tensor([0.5, 0.5, float("nan")], dtype=torch.float64))
    assert torch.allclose(out.advantages, torch.tensor([[0.5, 0.5, 0], [-0.8, -0.7, -0.7], [0, 0, 0]],
                                                       dtype=torch.float64), atol=1e-12)
    # whiten_over: rows takes one value per row, its mean advantage: 0.5 and -2.2/3 = -0.733333; mean
    # -0.116667, population std 0.616667; applied per token: row 0 (0.5 + 0.116667) / 0.616667 = 1.0,
    # row 1 (-0.8 + 0.116667) / 0.616667 = -1.108108 and (-0.7 + 0.116667) / 0.616667 = -0.945946
    rows = advantages(ReMax(whiten=True, whiten_over="rows", whiten_eps=0.0), torch.tensor([1.0, 0.0, 1.0],
                      dtype=torch.float64), torch.arange(3), mask, tr,
                      greedy_rewards=torch.tensor([0.5, 0.5, float("nan")], dtype=torch.float64)).advantages
    assert torch.allclose(rows, torch.tensor([[1.0, 1.0, 0], [-1.108108, -0.945946, -0.945946], [0, 0, 0]],
                                             dtype=torch.float64), atol=1e-6)
    with pytest.raises(ConfigError, match="greedy: true"):
        policyzoo.assemble({"base": "grpo", "baseline": {"use": "remax"}})


def test_greedy_rows_are_rewarded_then_dropped_by_the_step():
    # Bandit: candidate 0 is the greedy answer (logit 2); it is right for question 0 and wrong for 1.
    from policyzoo.step import train_step
    from policyzoo.testing import HookRecorder
    from policyzoo.testing.bandit import Bandit, bandit_run, step_settings

    bandit = Bandit([[1, 2, 3], [1, 2, 3]], [[True, False, True], [False, True, True]],
                    logits=[[2.0, 0.0, 0.0], [2.0, 0.0, 0.0]], lr=0.01)
    run = bandit_run({"base": "remax", "sample": {"n": 3}})
    rec = HookRecorder().attach(run)
    m = train_step(run, bandit, lambda: bandit.prompts(4), seed=0, settings=step_settings(run))
    (sample,), (base,) = rec.of("sample"), rec.of("baseline")
    assert len(sample.result) == 4 * 3 + 4 and int(sample.result.greedy.sum()) == 4  # P x n + P rows
    assert m["rows"] == 12 and len(base.kwargs["rewards"]) == 12  # the greedy rows never reach training
    questions = torch.tensor([row["question"] for row in sample.result.rows[:12]])
    expect = (questions == 0).double()  # the greedy answer scores 1 on question 0, 0 on question 1
    assert torch.equal(base.kwargs["greedy_rewards"].double(), expect)
    assert m["reward_greedy"] == pytest.approx(float(expect[::3].mean()))


# ----------------------------------------------------------------------------- optimal token baseline
def otb(comp, mask, pi2_rows):
    """Group of 2: row 0 reward 1, row 1 reward 0; pi = 0.5 on every token (old log-prob ln 0.5)."""
    old = torch.full(mask.shape, math.log(0.5), dtype=torch.float64)
    pi2 = torch.tensor(pi2_rows, dtype=torch.float64).unsqueeze(-1).expand(mask.shape)
    return advantages(comp, torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([0, 0]), mask,
                      old_logprobs=old, sum_pi_squared=pi2).advantages


def test_optimal_token_baseline_by_hand():
    # s_t = 1 - 2 x 0.5 + sum pi^2: row 0 (sum pi^2 0.5) 0.5 per token, W = [0.5, 1.0, 1.5];
    # row 1 (0.9) 0.9 per token, W = [0.9, 1.8]. Returns: row 0 [1, 1, 1], row 1 [0, 0].
    # B_0 = 1 x 0.5 / (0.5 + 0.9) = 0.357143; B_1 = 1 x 1.0 / (1.0 + 1.8) = 0.357143; B_2 = 1.5 / 1.5 = 1
    # -> row 0 [0.642857, 0.642857, 0], row 1 [-0.357143, -0.357143]. zero_tail: row 0 is the unique
    # longest, its baseline past position 2 (the second longest's length) is 0 -> A_2 = 1.
    mask = mask_of([3, 2])
    a = otb(OptimalTokenBaseline(), mask, [0.5, 0.9])
    assert torch.allclose(a, torch.tensor([[0.642857, 0.642857, 0.0], [-0.357143, -0.357143, 0.0]],
                                          dtype=torch.float64), atol=1e-6)
    a = otb(OptimalTokenBaseline(zero_tail=True), mask, [0.5, 0.9])
    assert a[0, 2].item() == pytest.approx(1.0, abs=1e-9)


def test_tir_optimal_token_baseline_aligns_trainable_tokens():
    # row 1's mask has a hole: [1, 0, 1]; W row 1 = [0.9, -, 1.8]. By position: B_1 sees row 0 only
    # (W 1.0) -> 1; B_2 = (1 x 1.5 + 0 x 1.8) / 3.3 = 0.454545 -> row 0 [0.642857, 0, 0.545455],
    # row 1 [-0.357143, 0, -0.454545]. By trainable token (tir): row 1's 2nd token pairs with row 0's
    # 2nd: B = 1 / 2.8 = 0.357143 -> row 1 [-0.357143, 0, -0.357143]; row 0's 3rd token has no
    # partner and, zero_tail on, baseline 0 -> A = 1.
    mask = torch.tensor([[True, True, True], [True, False, True]])
    pos = otb(OptimalTokenBaseline(), mask, [0.5, 0.9])
    assert torch.allclose(pos, torch.tensor([[0.642857, 0.0, 0.545455], [-0.357143, 0.0, -0.454545]],
                                            dtype=torch.float64), atol=1e-6)
    tir = otb(TIROptimalTokenBaseline(), mask, [0.5, 0.9])
    assert torch.allclose(tir, torch.tensor([[0.642857, 0.642857, 1.0], [-0.357143, 0.0, -0.357143]],
                                            dtype=torch.float64), atol=1e-6)
    with pytest.raises(ConfigError, match="sum_pi_squared"):
        advantages(OptimalTokenBaseline(), torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), mask)


def test_the_step_scores_pi_squared_for_the_optimal_token_baseline():
    # uniform bandit over 3 candidates: pi = 1/3 -> old log-prob ln(1/3), sum pi^2 = 3 x 1/9 = 1/3 on the
    # choice token; the filler tokens are deterministic (sum pi^2 = 1)
    from policyzoo.step import train_step
    from policyzoo.testing import HookRecorder
    from policyzoo.testing.bandit import Bandit, bandit_run, step_settings

    bandit = Bandit([[2, 2, 2]], [[True, False, False]], lr=0.01)
    run = bandit_run({"base": "grpo", "baseline": "optimal_token_baseline"})
    rec = HookRecorder().attach(run)
    train_step(run, bandit, lambda: bandit.prompts(2), seed=0, settings=step_settings(run))
    (base,) = rec.of("baseline")
    assert torch.allclose(base.kwargs["sum_pi_squared"][:, 0], torch.full((16,), 1 / 3))
    assert torch.allclose(base.kwargs["sum_pi_squared"][:, 1], torch.ones(16))
    assert torch.allclose(base.kwargs["old_logprobs"][:, 0], torch.full((16,), math.log(1 / 3)))


# ----------------------------------------------------------------------------- NaN across reward components
def half(prompts, completions, **columns):
    """A second reward function for the NaN switch: 0.5 on every row."""
    return [0.5] * len(prompts)


def test_reward_nan_switch():
    # Bandit candidate 1 scores NaN under bandit_correct (unscorable), candidate 0 scores 1; the second
    # component gives 0.5 everywhere. unscorable: candidate-1 rows get NaN (the sum 1 x NaN + 0.5);
    # nansum (TRL): they get 0 x 1 + 0.5 = 0.5; candidate-0 rows 1 + 0.5 = 1.5 either way.
    from policyzoo import use
    from policyzoo.step import train_step
    from policyzoo.testing import HookRecorder
    from policyzoo.testing.bandit import Bandit, bandit_catalog, step_settings

    for rule in ("unscorable", "nansum"):
        bandit = Bandit([[1, 1]], scores=[[1.0, float("nan")]], lr=0.01)
        run = policyzoo.assemble("grpo", rewards=(use("bandit_correct"), use("function",
                                 function="test_math_baseline_variants:half")), catalog=bandit_catalog())
        rec = HookRecorder().attach(run)
        train_step(run, bandit, lambda: bandit.prompts(2), seed=0, settings=step_settings(run, reward_nan=rule))
        (base,) = rec.of("baseline")
        picked = rec.of("sample")[0].result.response_ids[:, 0]
        got = base.kwargs["rewards"]
        assert 0 < int((picked == 1).sum()) < 16  # both candidates were sampled
        assert bool((got[picked == 0] == 1.5).all())
        if rule == "unscorable":
            assert bool(torch.isnan(got[picked == 1]).all())
        else:
            assert bool((got[picked == 1] == 0.5).all())


def test_empty_rows_switch_of_the_per_row_reduces():
    # row 0: per-token loss [1, 3] (mean 2, sum 4); row 1: no token. totals: 2 tokens, 1 sequence, 2 rows.
    # skip (default): seq_mean_token_mean 2 / 1 = 2, seq_mean_token_sum 4 / 1 = 4, token_sum_norm (C 4) 4 / 4 = 1;
    # count (TRL 'grpo'/'dr_grpo'): each divided by 2 rows -> 1, 2, 0.5. Split per row into two
    # micro-batches with the step's totals: 1 + 0 = 1 (exact).
    from policyzoo.contract import StepTotals
    from policyzoo.plugins.reduce import SeqMeanTokenMean, SeqMeanTokenSum, TokenSumNorm

    loss = torch.tensor([[1.0, 3.0], [0.0, 0.0]])
    mask = torch.tensor([[True, True], [False, False]])
    totals = StepTotals(tokens=2, sequences=1, rows=2)
    cases = ((SeqMeanTokenMean, {}, 2.0), (SeqMeanTokenSum, {}, 4.0), (TokenSumNorm, {"constant": 4.0}, 1.0))
    for cls, extra, skip in cases:
        assert cls(**extra).reduce(loss=loss, response_mask=mask, totals=totals).item() == skip
        counted = cls(empty_rows="count", **extra)
        assert counted.reduce(loss=loss, response_mask=mask, totals=totals).item() == skip / 2
        parts = sum(counted.reduce(loss=loss[i:i + 1], response_mask=mask[i:i + 1], totals=totals) for i in range(2))
        assert parts.item() == skip / 2
