"""policyzoo compare's mechanism metrics, clipped bands and verdict, against arithmetic worked by hand on run
folders written here (no training), and the step's length of right and wrong answers."""

from __future__ import annotations

import json
import math

import pytest
import torch
from _compare_helpers import write_run

from policyzoo.compare import aggregate, plot, report
from policyzoo.compare.rundirs import find_runs

T1 = 12.706204736  # t_{0.975, 1} = tan(0.475 pi)
T2 = 4.302652730  # t_{0.975, 2}


def _mechanisms(path, seed: int, steps: int = 6) -> None:
    """Add the mechanism metrics to a run written by ``write_run``: per step k, clip_frac_low 0.01 k,
    clip_frac_high 0.02 k, zero_std_frac 0.1 k + 0.04 seed, kept_frac 0.5 (0.25 at k = 6), length of right
    answers 10 + k, of wrong ones 20 + k (null at k = 6), 40 k rollout tokens over 8 kept rows; the held-out
    evaluations over 100 rows."""
    lines = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]
    for r in lines:
        k = r["step"]
        if r["kind"] == "eval":
            r["eval_rows"] = 100
            continue
        r.update(clip_frac_low=0.01 * k, clip_frac_high=0.02 * k, zero_std_frac=0.1 * k + 0.04 * seed,
                 kept_frac=0.25 if k == 6 else 0.5, response_length_correct_mean=10.0 + k,
                 response_length_wrong_mean=None if k == 6 else 20.0 + k, rollout_tokens=40 * k, rows=8)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def _algo(result, name):
    return next(a for a in result["algorithms"] if a["algorithm"] == name)


def test_mechanism_metrics_by_hand(tmp_path):
    for s in (0, 1):
        _mechanisms(write_run(tmp_path / "dapo" / f"seed{s}", "dapo", s, 0.5), s)
        write_run(tmp_path / "grpo" / f"seed{s}", "grpo", s, 0.4)  # an older run: none of these metrics
    result = aggregate.aggregate(find_runs([str(tmp_path)])[0], baseline="grpo")
    run0 = next(r for r in result["runs"] if r["algorithm"] == "dapo" and r["seed"] == 0)
    # window: 6 steps -> ceil(6 / 5) = 2 steps, k = 5 and 6
    assert run0["clip_low"] == pytest.approx((0.05 + 0.06) / 2) and run0["clip_high"] == pytest.approx(
        (0.10 + 0.12) / 2)
    assert run0["zero_std"] == pytest.approx((0.5 + 0.6) / 2) and run0["kept"] == pytest.approx((0.5 + 0.25) / 2)
    assert run0["length_correct"] == pytest.approx((15 + 16) / 2)
    assert run0["length_wrong"] == pytest.approx(25.0)  # step 6 has none (null): the window mean of step 5 alone
    # whole run: 40 (1 + ... + 6) = 840 tokens sampled over 6 x 8 = 48 kept rows
    assert run0["tokens_per_kept_row"] == pytest.approx(840 / 48) and run0["eval_rows"] == 100
    d = _algo(result, "dapo")
    # zero_std per seed: 0.55 and 0.59: mean 0.57, s = sqrt(2 x 0.02^2 / 1) = 0.02 sqrt 2, h = t1 x s / sqrt 2
    assert d["zero_std"]["mean"] == pytest.approx(0.57) and d["zero_std"]["half_width"] == pytest.approx(T1 * 0.02)
    g = _algo(result, "grpo")
    assert g["length_correct"] is None and g["tokens_per_kept_row"] is None and g["clip_low"]["mean"] == 0.1
    head, rows = report.mechanism_rows(result)
    assert head == ["algorithm", "KL", "entropy", "clip low", "clip high", "zero-std groups", "kept", "response len",
                    "len right", "len wrong", "tokens / kept row"]
    # the rows in the order found (dapo before grpo); grpo's clip low is 0.1 at every step (write_run)
    assert rows[0][3:] == ["0.055", "0.110", "0.57", "0.38", "55.0", "15.5", "25.0", "17.5"]
    assert rows[1][3:5] == ["0.100", "0.110"] and rows[1][-3:] == ["-", "-", "-"]
    band = d["curves"]["tokens_per_kept_row"]
    assert band["step"] == [1, 2, 3, 4, 5, 6] and band["mean"] == pytest.approx([5.0 * k for k in range(1, 7)])


def test_a_filters_dropped_zero_std_rows_count_in_the_zero_std_fraction():
    from policyzoo.compare.aggregate import with_clip_frac

    # dapo's step: 16 rows sampled, its filter dropped 8 (zero-std groups), and of the 8 kept 0 are zero-std:
    # (8 + 0 x 8) / 16 = 0.5, where the step's own figure (over the kept rows) reads 0
    step = {"sampled_rows": 16, "rows": 8, "filtered/zero_std_group": 8, "zero_std_frac": 0.0}
    assert with_clip_frac(step)["zero_std_frac"] == 0.5
    # a skipped step (nothing kept, no zero_std_frac): 32 of 32 sampled rows dropped = 1.0
    assert with_clip_frac({"sampled_rows": 32, "rows": 0, "filtered/zero_std_group": 32})["zero_std_frac"] == 1.0
    # no such filter: the step's own figure stands
    assert with_clip_frac({"sampled_rows": 32, "rows": 32, "zero_std_frac": 0.25})["zero_std_frac"] == 0.25


def test_right_and_wrong_answer_lengths_of_a_batch_by_hand():
    from _engine_helpers import make_rollout

    from policyzoo.step.learn import _batch_metrics

    rollout = make_rollout([[1]] * 4, [[5, 6, 7], [5, 6, 7, 8, 9], [5, 6], [5, 6, 7, 8]])
    m = _batch_metrics(rollout, torch.tensor([1.0, 0.0, math.nan, -1.0]))
    # right: reward > 0, row 0 (3 tokens); wrong: reward <= 0, rows 1 and 3 (5 and 4 tokens); row 2 unscorable
    assert m["response_length_correct_mean"] == 3.0 and m["response_length_wrong_mean"] == 4.5
    assert m["response_length_mean"] == (3 + 5 + 2 + 4) / 4
    none_right = _batch_metrics(rollout, torch.zeros(4))
    assert math.isnan(none_right["response_length_correct_mean"]) and none_right["response_length_wrong_mean"] == 3.5


def test_bands_are_cut_to_each_metric_range():
    # accuracy 0.1 +- 0.3 -> [-0.2, 0.4] cut to [0, 0.4]; 0.9 +- 0.3 -> [0.6, 1.2] cut to [0.6, 1]; no h: no band
    assert plot.band_limits([0.1, 0.9, 0.5], [0.3, 0.3, None], 0.0, 1.0) == [
        (0, 0.0, pytest.approx(0.4)), (1, pytest.approx(0.6), 1.0)]
    assert plot.band_limits([2.0], [3.0], 0.0, None) == [(0, 0.0, 5.0)]  # a length: >= 0, no upper bound
    assert plot.band_limits([-1.0], [2.0], None, None) == [(0, -3.0, 1.0)]  # the training reward: unbounded
    assert plot.value_range("eval", "accuracy") == (0.0, 1.0)
    assert plot.value_range("eval", "held-out reward") == (None, None)
    assert [plot.value_range(k, "accuracy") for k in ("zero_std_frac", "kept_frac", "clip_frac")] == [(0.0, 1.0)] * 3
    non_negative = ("kl_ref", "entropy", "response_length_mean", "response_length_wrong_mean", "tokens_per_kept_row")
    assert [plot.value_range(k, "accuracy") for k in non_negative] == [(0.0, None)] * 5
    assert plot.value_range("reward_mean", "accuracy") == (None, None)


def _three(tmp_path, name, afters):
    for s, after in enumerate(afters):
        _mechanisms(write_run(tmp_path / name / f"seed{s}", name, s, after), s)


def test_verdict_names_what_separates_and_what_does_not(tmp_path):
    _three(tmp_path, "grpo", [0.2, 0.4, 0.6])
    _three(tmp_path, "dapo", [0.3, 0.6, 0.75])  # paired d = 0.1, 0.2, 0.15
    _three(tmp_path, "rloo", [0.3, 0.3, 0.6])  # paired d = 0.1, -0.1, 0.0
    result = aggregate.aggregate(find_runs([str(tmp_path)])[0], baseline="grpo")
    lines = report.verdict(result)
    # dapo: mean 0.15, s = sqrt((0.05^2 + 0.05^2 + 0) / 2) = 0.05, h = t2 x 0.05 / sqrt 3 = 0.1242; [0.026, 0.274]
    h = T2 * 0.05 / math.sqrt(3)
    assert f"{h:.3f}" == "0.124"
    assert "dapo's held-out accuracy is higher than grpo's: +0.150 ± 0.124 over 3 paired seeds, 95% interval " \
           "[+0.026, +0.274] excludes 0." in lines
    # rloo: mean 0, s = sqrt((0.01 + 0.01 + 0) / 2) = 0.1, h = t2 x 0.1 / sqrt 3 = 0.2484: [-0.248, +0.248]
    assert "rloo and grpo are not told apart: +0.000 ± 0.248 over 3 paired seeds, 95% interval [-0.248, +0.248] " \
           "includes 0." in lines
    assert any(x.startswith("Smallest gap this design resolves: the paired half-width, 0.124 to 0.248") for x in lines)
    # grpo's mean after 0.4 over 100 rows: sqrt(0.4 x 0.6 / 100) = 0.04899
    assert any("sqrt(p(1-p)/100) = 0.049" in x for x in lines)
    flipped = report.verdict(aggregate.aggregate(find_runs([str(tmp_path)])[0], baseline="dapo"))
    assert any(x.startswith("grpo's held-out accuracy is lower than dapo's: -0.150 ± 0.124") for x in flipped)
    report.write(result, [], tmp_path, "policyzoo compare x")
    md = (tmp_path / "compare.md").read_text()
    assert "## Verdict" in md and md.index("## Verdict") > md.index("| algorithm | KL |")


def test_equal_scores_in_every_seed_are_said_so_not_given_a_zero_width(tmp_path):
    _three(tmp_path, "grpo", [0.37, 0.36, 0.39])
    _three(tmp_path, "dr_grpo", [0.37, 0.36, 0.39])  # paired d = 0, 0, 0: s = 0, half-width 0
    _three(tmp_path, "rloo", [0.3, 0.3, 0.6])  # paired d = -0.07, -0.06, +0.21: a real spread
    lines = report.verdict(aggregate.aggregate(find_runs([str(tmp_path)])[0], baseline="grpo"))
    same = "dr_grpo and grpo scored the same held-out accuracy in each of 3 paired seeds"
    assert any(x.startswith(same) for x in lines)
    assert not any(x.startswith("dr_grpo and grpo are not told apart") for x in lines)
    # the resolution line reads rloo's width only: d = -0.07, -0.06, +0.21, mean 0.0267, s = 0.1588,
    # h = 4.303 x 0.1588 / sqrt 3 = 0.3945; never the 0.000 of the equal pair
    gap = next(x for x in lines if x.startswith("Smallest gap"))
    assert "half-width, 0.395 here" in gap


def test_one_seed_gives_no_verdict(tmp_path):
    _three(tmp_path, "grpo", [0.2])
    _three(tmp_path, "dapo", [0.3])
    lines = report.verdict(aggregate.aggregate(find_runs([str(tmp_path)])[0], baseline="grpo"))
    assert lines[0] == "dapo - grpo: +0.100 from one seed pair: no interval, no verdict (--seeds 3 or more)."
    assert not any(x.startswith("Smallest gap") for x in lines)
    alone = aggregate.aggregate(find_runs([str(tmp_path / "grpo")])[0])
    assert report.verdict(alone)[0] == "Only grpo was compared: nothing to judge."
