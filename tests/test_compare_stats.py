"""policyzoo compare's aggregation against arithmetic worked by hand, on run directories written here
(config.yaml, summary.json, metrics.jsonl as `policyzoo train` writes them; no training)."""

from __future__ import annotations

import json
import math

import pytest
from _compare_helpers import write_run

from policyzoo.compare import aggregate, intervals
from policyzoo.compare.api import compare
from policyzoo.compare.rundirs import find_runs
from policyzoo.errors import UserError

T2 = 4.302652730  # t_{0.975, 2}: (2p - 1) / sqrt(2 p (1 - p)) at p = 0.975 = 0.95 / sqrt(0.04875) (closed form, df 2)


GRPO_AFTER, DR_AFTER = [0.2, 0.4, 0.6], [0.3, 0.6, 0.6]


@pytest.fixture
def two_algos(tmp_path):
    for s in range(3):
        write_run(tmp_path / "grpo" / f"seed{s}", "grpo", s, GRPO_AFTER[s], reward_offset=s / 100)
        write_run(tmp_path / "dr_grpo" / f"seed{s}", "dr_grpo", s, DR_AFTER[s], kl=False)
    return tmp_path


def _algo(result, name):
    return next(a for a in result["algorithms"] if a["algorithm"] == name)


def test_intervals_paired_differences_and_last_window_by_hand(two_algos):
    runs, skipped = find_runs([str(two_algos)])
    assert skipped == [] and len(runs) == 6
    result = aggregate.aggregate(runs, baseline="grpo")
    g, d = _algo(result, "grpo"), _algo(result, "dr_grpo")
    # grpo after 0.2, 0.4, 0.6: mean 0.4; squares 0.04 + 0 + 0.04 = 0.08, / 2 -> s = 0.2; h = t2 * 0.2 / sqrt 3
    assert g["eval_after"]["mean"] == pytest.approx(0.4) and g["eval_after"]["std"] == pytest.approx(0.2)
    assert g["eval_after"]["half_width"] == pytest.approx(T2 * 0.2 / math.sqrt(3), rel=1e-9)
    # dr_grpo after 0.3, 0.6, 0.6: mean 0.5; squares 0.04 + 0.01 + 0.01 = 0.06, / 2 = 0.03;
    # h = t2 * sqrt(0.03 / 3) = t2 * 0.1
    assert d["eval_after"]["mean"] == pytest.approx(0.5) and d["eval_after"]["half_width"] == pytest.approx(T2 * 0.1)
    # paired d = 0.1, 0.2, 0.0: mean 0.1; squares 0 + 0.01 + 0.01 = 0.02, / 2 -> s = 0.1; h = t2 * 0.1 / sqrt 3
    diff = d["paired_diff"]
    assert diff["mean"] == pytest.approx(0.1) and diff["half_width"] == pytest.approx(T2 * 0.1 / math.sqrt(3))
    assert diff["pairs"] == [[0, 0], [1, 1], [2, 2]] and g["paired_diff"] is None
    # before: 0.1 everywhere -> s = 0, h = 0
    assert g["eval_before"]["mean"] == pytest.approx(0.1) and g["eval_before"]["half_width"] == pytest.approx(0.0)
    # window: 6 steps -> ceil(6 / 5) = 2 steps (5 and 6). grpo seed s reward (0.5 + 0.6) / 2 + s / 100 = 0.55, 0.56,
    # 0.57: mean 0.56, s = 0.01, h = t2 * 0.01 / sqrt 3
    assert g["reward"]["mean"] == pytest.approx(0.56) and g["reward"]["half_width"] == pytest.approx(
        T2 * 0.01 / math.sqrt(3))
    run0 = next(r for r in result["runs"] if r["algorithm"] == "grpo" and r["seed"] == 0)
    assert run0["window_steps"] == [5, 6]
    assert run0["kl"] == pytest.approx((0.05 + 0.06) / 2)  # kl_ref k / 100 at k = 5, 6
    assert run0["entropy"] == pytest.approx((2.0 + 3.0) / 2)  # steps 1-4 (1.0) are outside the window
    assert run0["clip_frac"] == pytest.approx(((0.1 + 0.10) + (0.1 + 0.12)) / 2)  # low + high at k = 5, 6
    assert run0["response_length"] == pytest.approx((50 + 60) / 2)
    # step time: median of 1, 2, 3, 4, 85 (the first step's 5 s left out) = 3; tokens: 6 x 150 = 900 over 100 s
    assert run0["step_seconds"] == pytest.approx(3.0) and run0["tokens_per_s"] == pytest.approx(9.0)
    assert run0["peak_rss_gib"] == pytest.approx(2.5)  # the summary's 2.5 over the records' 1.1 .. 1.6
    assert d["kl"] is None and run0["reward_last_step"] == pytest.approx(0.6)  # dr_grpo logs no kl_ref


def test_last_window_rounds_up_in_integers():
    # ceil(steps / 5): 1 -> 1, 2 -> 1 (0.4 up), 5 -> 1, 6 -> 2, 15 -> 3 (0.2 * 15 is 3.0000000000000004 in floats)
    assert [intervals.last_window(n) for n in (1, 2, 5, 6, 10, 15, 16)] == [1, 1, 1, 2, 2, 3, 4]


def test_t_table_is_the_t_distribution():
    """Each T975 value integrates the t density to 0.475 from 0 (Simpson, 4000 intervals); df 1 is
    tan(0.475 pi) = cot(pi / 40), df 2 the closed form above; above 30 Cornish-Fisher within 1e-5."""
    def cdf_half(t, df):  # integral of the Student t density from 0 to t
        c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
        n, h = 4000, t / 4000
        f = [c * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(n + 1)]
        return h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))
    assert intervals.t975(1) == pytest.approx(math.tan(0.475 * math.pi), abs=1e-8)
    assert intervals.t975(2) == pytest.approx(0.95 / math.sqrt(0.04875), abs=1e-8)
    for df in range(2, 31):
        assert cdf_half(intervals.t975(df), df) == pytest.approx(0.475, abs=2e-9), df
    for df in (31, 40, 100):  # the density near t ~ 2 is ~0.06: 1e-5 in t is < 1e-6 in probability
        assert cdf_half(intervals.t975(df), df) == pytest.approx(0.475, abs=1e-6), df
    with pytest.raises(ValueError):
        intervals.t975(0)


def test_one_seed_gives_values_and_says_no_interval(tmp_path, capsys):
    write_run(tmp_path / "grpo" / "seed0", "grpo", 0, 0.3)
    write_run(tmp_path / "dr_grpo" / "seed0", "dr_grpo", 0, 0.5)
    result = compare(str(tmp_path), baseline="grpo")
    d = _algo(result, "dr_grpo")
    assert d["eval_after"]["mean"] == 0.5 and d["eval_after"]["half_width"] is None
    assert d["paired_diff"]["mean"] == pytest.approx(0.2) and d["paired_diff"]["half_width"] is None  # 0.5 - 0.3
    out = capsys.readouterr().out
    assert "no interval can be given" in out
    md = (tmp_path / "compare.md").read_text()
    assert "| dr_grpo | 1 | 0.100 | 0.500 | +0.200 |" in md and "no interval can be given" in md
    assert (tmp_path / "compare.png").stat().st_size > 10_000
    assert json.loads((tmp_path / "compare.json").read_text())["baseline"] == "grpo"


def test_mixed_runs_are_refused_with_the_keys_named(tmp_path):
    write_run(tmp_path / "a", "grpo", 0, 0.3)
    write_run(tmp_path / "b", "dr_grpo", 0, 0.5, steps=8, model__path="other")
    runs, _ = find_runs([str(tmp_path)])
    with pytest.raises(UserError) as e:
        aggregate.aggregate(runs)
    assert "train.steps" in e.value.why and "model.path" in e.value.why and "--allow-mixed" in e.value.fix
    assert "lr" not in e.value.why and "output_dir" not in e.value.why  # equal, and ignored
    result = aggregate.aggregate(runs, allow_mixed=True)
    assert set(result["mixed_keys"]) == {"train.steps", "model.path"}
    # steps 8: window ceil(8 / 5) = 2 steps (7 and 8): reward (0.7 + 0.8) / 2
    assert _algo(result, "dr_grpo")["reward"]["mean"] == pytest.approx(0.75)


def test_hybrid_labels_come_from_the_varying_algorithm_keys(tmp_path):
    shared = {"sample": {"max_tokens": 12}}  # the same in every run: not part of a label
    write_run(tmp_path / "g", {"base": "grpo", **shared}, 0, 0.3)
    write_run(tmp_path / "c", {"base": "grpo", "clip": {"use": "cispo"}, **shared}, 0, 0.4)
    write_run(tmp_path / "e", {"base": "grpo", "clip": {"eps_high": 0.28}, **shared}, 0, 0.5)
    result = aggregate.aggregate(find_runs([str(tmp_path)])[0], baseline="grpo+clip=cispo")
    names = [a["algorithm"] for a in result["algorithms"]]
    assert sorted(names) == ["grpo", "grpo+clip.eps_high=0.28", "grpo+clip=cispo"]
    assert result["baseline"] == "grpo+clip=cispo"
    assert _algo(result, "grpo")["paired_diff"]["mean"] == pytest.approx(0.3 - 0.4)
    with pytest.raises(UserError, match="did you mean 'grpo'"):
        aggregate.aggregate(find_runs([str(tmp_path)])[0], baseline="gpro")


def test_half_written_and_empty_folders_are_named_and_skipped(tmp_path, capsys):
    from policyzoo.cli import main

    write_run(tmp_path / "grpo" / "seed0", "grpo", 0, 0.3)
    write_run(tmp_path / "grpo" / "seed1", "grpo", 1, 0.5)
    half = write_run(tmp_path / "grpo" / "seed2", "grpo", 2, 0.9)
    (half / "summary.json").write_text('{"steps": 6, "eval_acc')  # cut while written
    (half / "checkpoints").mkdir()
    (half / "checkpoints" / "latest.json").write_text('{"step": 3, "path": "step-000003"}')
    (tmp_path / "grpo" / "seed3").mkdir()
    assert main(["compare", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert "Traceback" not in out
    assert f"{half} left out: no complete summary.json" in out and f"policyzoo train --resume {half}" in out
    assert f"{tmp_path / 'grpo' / 'seed3'} left out: empty directory" in out
    # a checkpoint of the final step (6 of 6) but no summary: `--resume` alone is refused ("already at step 6"), the
    # hint names one step more, 6 + 1
    (half / "checkpoints" / "latest.json").write_text('{"step": 6, "path": "step-000006"}')
    assert main(["compare", str(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"so `--resume` alone is refused: `policyzoo train --resume {half} train.steps=7`" in out
    data = json.loads((tmp_path / "compare.json").read_text())
    assert data["algorithms"][0]["n"] == 2 and len(data["skipped"]) == 2
    assert data["algorithms"][0]["eval_after"]["mean"] == pytest.approx(0.4)  # (0.3 + 0.5) / 2, seed2 left out


def test_a_seed_twice_and_nothing_found_are_user_errors(tmp_path):
    write_run(tmp_path / "x" / "a", "grpo", 0, 0.3)
    write_run(tmp_path / "x" / "b", "grpo", 0, 0.4)
    with pytest.raises(UserError, match="two runs of grpo have train.seed 0"):
        aggregate.aggregate(find_runs([str(tmp_path / "x")])[0])
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no finished run"):
        compare(str(tmp_path / "empty"))
