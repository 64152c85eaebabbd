"""DAPO's dynamic sampling on the bandit: the step re-samples until the batch is full.

Two question types make the counts exact: question 0 has two candidates that are both right, so
every group of it is constant (all rewards 1) and ``nonconstant_groups`` drops it; question 1 has
one right and one wrong candidate at probability 1/2 each, so a group of G = 8 is constant with
probability 2 x (1/2)^8 = 1/128 and kept otherwise. The prompt stream is fixed by the test, the
seeds are fixed, and in these seeds no question-1 group happens to be constant (checked through
``filtered/zero_std_group``, which counts exactly the question-0 rows).
"""

import pytest
import torch

from policyzoo.errors import UserError
from policyzoo.step import ShortfallError, train_step
from policyzoo.testing.bandit import Bandit, bandit_run, step_settings

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


ALWAYS, MIXED = 0, 1
# DAPO with its soft overlong penalty kept but out of reach: L_max 32, L_cache 8, so responses up
# to 32 - 8 = 24 tokens (all of them here, <= 20) get penalty 0 and rewards stay exactly 0/1.
# (With the bundle's defaults, L_max 256 and L_cache 512 clipped to 256, the ramp starts at
# length 0 and every response is penalised -|y|/256, so no group of unequal lengths is constant.)
DAPO = {"base": "dapo", "sample": {"max_tokens": 32}, "reward": [{"use": "overlong_penalty", "cache": 8}]}


def two_questions():
    return Bandit([[3, 5], [3, 5]], [[True, True], [True, False]], optimizer="sgd", lr=0.1)


def stream(bandit, questions):
    rows = {q: {"prompt": f"question {q}", "question": q, "scores": bandit.scores[q].tolist()} for q in (0, 1)}
    return lambda: [dict(rows[q]) for q in questions]


def test_dapo_declares_dynamic_sampling(catalog):
    run = bandit_run("dapo", catalog)
    assert [f.name for f in run.filter] == ["nonconstant_groups"] and run.filter[0].params.resample
    assert step_settings(run).max_sample_rounds == 3


def test_half_constant_prompts_need_two_rounds(catalog):
    run = bandit_run(DAPO, catalog)
    bandit = two_questions()
    # 4 prompts x G 8 = 32 target rows; per round the two MIXED groups (16 rows) are kept, the two
    # ALWAYS groups (16 rows) dropped. Round 1: 16 kept < 32; round 2: 32 kept -> stop.
    m = train_step(run, bandit, stream(bandit, [ALWAYS, ALWAYS, MIXED, MIXED]), seed=0,
                   settings=step_settings(run))
    assert m["sample_rounds"] == 2 and m["sampled_rows"] == 64 and m["rows"] == 32
    assert m["kept_frac"] == 0.5  # 32 / 64
    assert m["filtered/zero_std_group"] == 32  # 2 rounds x 2 ALWAYS groups x 8 rows
    assert "shortfall_rows" not in m


def test_surplus_keeps_whole_groups_first_come(catalog):
    run = bandit_run(DAPO, catalog)
    bandit = two_questions()
    # 3 MIXED + 1 ALWAYS per round: 24 kept, then 48 > 32 -> the first 4 kept groups (32 rows)
    m = train_step(run, bandit, stream(bandit, [MIXED, MIXED, MIXED, ALWAYS]), seed=0, settings=step_settings(run))
    assert m["sample_rounds"] == 2 and m["sampled_rows"] == 64 and m["rows"] == 32
    assert m["kept_frac"] == 0.5


def test_shortfall_train_on_fewer(catalog):
    run = bandit_run(DAPO, catalog)
    bandit = two_questions()
    # 1 MIXED of 4 prompts: 8 rows kept per round, 3 rounds (DAPO's budget) -> 24 of 32 rows;
    # train_on_fewer trains on the 24 and reports the 8 missing
    m = train_step(run, bandit, stream(bandit, [ALWAYS, ALWAYS, ALWAYS, MIXED]), seed=0,
                   settings=step_settings(run, on_shortfall="train_on_fewer"))
    assert m["sample_rounds"] == 3 and m["sampled_rows"] == 96 and m["rows"] == 24
    assert m["shortfall_rows"] == 8 and m["kept_frac"] == 0.25  # 24 / 96
    assert not torch.equal(bandit.theta.detach(), torch.zeros(2, 2))  # it did train
    # the ALWAYS question had zero advantage everywhere (never kept): its logits did not move
    assert torch.equal(bandit.theta.detach()[ALWAYS], torch.zeros(2))


def test_shortfall_error(catalog):
    run = bandit_run(DAPO, catalog)
    bandit = two_questions()
    with pytest.raises(ShortfallError) as e:
        train_step(run, bandit, stream(bandit, [ALWAYS, ALWAYS, ALWAYS, MIXED]), seed=0,
                   settings=step_settings(run, on_shortfall="error"))
    assert isinstance(e.value, UserError)
    text = str(e.value)
    assert "only 24 of 32 rows kept after 3 rounds" in text and "max_sample_rounds" in text
    assert torch.equal(bandit.theta.detach(), torch.zeros(2, 2))  # no update happened


def test_nothing_kept_skips_the_update_with_train_on_fewer(catalog):
    # documented in step.StepSettings: an empty batch cannot be trained on; train_on_fewer skips
    # the update (the engine stops after train.max_consecutive_skips such steps), error raises
    run = bandit_run(DAPO, catalog)
    bandit = two_questions()
    m = train_step(run, bandit, stream(bandit, [ALWAYS] * 4), seed=0,
                   settings=step_settings(run, on_shortfall="train_on_fewer"))
    assert m["skipped"] == 1 and m["rows"] == 0 and m["skip_reason"] == "no rows kept by the filters"
    assert torch.equal(bandit.theta.detach(), torch.zeros(2, 2))  # no update happened
    with pytest.raises(ShortfallError, match="only 0 of 32 rows"):
        train_step(run, bandit, stream(bandit, [ALWAYS] * 4), seed=0,
                   settings=step_settings(run, on_shortfall="error"))


def test_without_resample_one_round_only(catalog):
    # the same filter with resample off: one round, the batch simply shrinks, no shortfall check
    run = bandit_run({**DAPO, "filter": [{"use": "nonconstant_groups", "resample": False}]}, catalog)
    bandit = two_questions()
    m = train_step(run, bandit, stream(bandit, [ALWAYS, ALWAYS, MIXED, MIXED]), seed=0, settings=step_settings(run))
    assert m["sample_rounds"] == 1 and m["sampled_rows"] == 32 and m["rows"] == 16
    assert "shortfall_rows" not in m


def test_more_samples_per_kept_batch_as_accuracy_rises(catalog):
    # A kept group needs both outcomes: P(kept) = k = 1 - a^8 - (1 - a)^8, and a step samples
    # another round of 8 prompts until 8 groups are kept (at most 3 rounds). Kept groups after n
    # rounds ~ Binomial(8n, k), so E[rounds] = P1 + 2 (P2 - P1) + 3 (1 - P2) with Pn = P(Bin >= 8).
    # a = 0.4: k = 1 - 0.00066 - 0.01680 = 0.9825, P1 = k^8 = 0.868, P2 ~ 1 -> E[rounds] = 1.13.
    # a = 0.9: k = 1 - 0.4305 - 1e-8 = 0.5695, P1 = 0.011, P2 = 0.79 -> E[rounds] = 2.2.
    # Sampled rows per kept row equal the rounds (or more, when a short batch trains on fewer).
    # Stop 20 steps after accuracy passes 0.9: near a = 1 every group is constant and DAPO's
    # 3-round budget runs dry (an empty batch skips the update, see the test above).
    bandit = Bandit.random(8, 5, right=2, seed=0, lr=0.05)
    run = bandit_run(DAPO, catalog)
    settings = step_settings(run)
    history, late = [], []
    for i in range(300):
        m = train_step(run, bandit, lambda: bandit.prompts(8), seed=i, settings=settings)
        history.append(m)
        if bandit.accuracy() > 0.9:
            late.append(m)
        if len(late) == 20:
            break
    early = history[:10]
    assert len(late) == 20
    per_kept = lambda ms: sum(m["sampled_rows"] for m in ms) / sum(m["rows"] for m in ms)  # noqa: E731
    assert per_kept(early) < 1.4 and per_kept(late) > 1.8
    assert max(m["sample_rounds"] for m in late) >= 2 and all(m["sample_rounds"] <= 3 for m in history)
    # kept_frac is rows / sampled_rows, step by step
    assert all(m["kept_frac"] == pytest.approx(m["rows"] / m["sampled_rows"]) for m in history)
