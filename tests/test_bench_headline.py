"""bench/headline.py (``make bench``): the plan it prints without running anything heavy, and
README's speed table kept equal to bench/results/summary.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import headline  # noqa: E402
import summary  # noqa: E402


def test_dry_run_prints_the_plan_and_runs_nothing_heavy(monkeypatch, capsys):
    def heavy(*a, **k):
        raise AssertionError("--dry-run ran a heavy part")

    for name in ("execute", "machine_rates", "run", "start_once", "evict_page_cache"):
        monkeypatch.setattr(headline, name, heavy)
    headline.main(["--dry-run", "--pairs", "2"])
    out = capsys.readouterr().out
    for tokens, key in ((32, "step_ratio_default"), (128, "step_ratio_gsm8k_128"), (256, "step_ratio_gsm8k_256")):
        line = next(x for x in out.splitlines() if x.startswith(f"- {key} "))
        assert f"--max-tokens {tokens} " in line and "--pair-median" in line and f"--summary-key {key}" in line
    assert out.count("bench/ceiling.py --P 2 --G 4 --threads 2 --metrics") == 2  # one ceiling per pair
    assert out.count("start-up pair") == 2 and out.count("machine rates") == 2
    # minutes: rates 0.5 + step ratios 3 + 7 + 14 + 2 ceiling pairs x 5 + 2 start-up pairs x 1.5 + rates 0.5 = 38
    assert "expected: ~38.0 min" in out


def test_only_one_part_plans_that_part_and_records_only_its_entries(monkeypatch, capsys):
    headline.main(["--dry-run", "--pairs", "3", "--only", "startup"])
    out = capsys.readouterr().out
    assert out.count("start-up pair") == 3 and "step_ratio" not in out and "ceiling" not in out
    # minutes: rates 0.5 + 3 start-up pairs x 1.5 + rates 0.5 = 5.5
    assert "expected: ~5.5 min" in out
    recorded = []
    monkeypatch.setattr(headline, "machine_rates", lambda: {"fp32_model_gflops": 1.0})
    monkeypatch.setattr(headline, "evict_page_cache", lambda roots: 0)
    monkeypatch.setattr(headline, "start_once", lambda scratch, name: ({"cold": 9.0, "warm": 4.0}[name],
                                                                             {"startup_s": 3.0, "trainer_s": None}))
    monkeypatch.setattr(headline.bench_summary, "record", lambda key, value, **k: recorded.append((key, value)))
    monkeypatch.setattr(headline.bench_summary, "add_detail", lambda keys, extra: recorded.append((keys, extra)))
    a = headline.argparse.Namespace(pairs=2, only="startup")
    headline.execute(a, headline.plan(a))
    machine = {"machine": {"at_start": {"fp32_model_gflops": 1.0}, "at_end": {"fp32_model_gflops": 1.0}}}
    # the full run's machine entry is left alone; the rates go into the part's own entries
    assert recorded == [("startup_cold_s", 9.0), ("startup_warm_s", 4.0), (["startup_cold_s", "startup_warm_s"],
                                                                          machine)]


def test_add_detail_merges_into_existing_entries_only(tmp_path):
    path = tmp_path / "summary.json"
    summary.record("a", 1.5, argv=[], detail={"pairs": 2}, path=path)
    summary.add_detail(["a", "missing"], {"machine": {"x": 1}}, path=path)
    data = json.loads(path.read_text())
    assert data["a"]["value"] == 1.5 and data["a"]["detail"] == {"pairs": 2, "machine": {"x": 1}}
    assert "missing" not in data


def test_bad_pairs_is_refused():
    with pytest.raises(SystemExit):
        headline.main(["--dry-run", "--pairs", "0"])


def test_readme_table_equals_summary_json():
    data = json.loads(summary.SUMMARY.read_text())
    text = (ROOT / "README.md").read_text()
    i, j = text.index(headline.BEGIN) + len(headline.BEGIN), text.index(headline.END)
    assert text[i:j].strip() == headline.readme_table(data), "run: python bench/headline.py --readme"
    # and the table really shows the file's numbers: 0.337 -> 0.34 (rounded half up at 2 digits)
    if "step_ratio_default" in data:
        shown = headline._fmt(data["step_ratio_default"]["value"], "{:.2f}")
        assert f"| step time / TRL's, default task, 32-token answers | {shown} |" in text


def test_rounding_half_up_and_missing_entries():
    assert headline._fmt(0.475, "{:.2f}") == "0.48" and headline._fmt(0.468, "{:.2f}") == "0.47"
    assert headline._fmt(10.65, "{:.1f}") == "10.7"
    table = headline.readme_table({"train_over_ceiling": {"value": 1.866, "commit": "abc1234",
                                                          "date": "2026-12-01T11:02:03Z"}})
    assert "| training time / its fp32 FLOP ceiling (GSM8K, 128 tokens) | 1.87 | abc1234, 2026-12-01 |" in table
    assert table.count("not measured yet") == len(headline.README_ROWS) - 1
    own = {"machine": {"at_start": {"fp32_model_gflops": 284.6, "copy_gb_s": 20.86, "python_mops": 57.9}}}
    table = headline.readme_table({"startup_warm_s": {"value": 16.54, "commit": "f1b690e", "date": "2026-12-02T08:33Z",
                                                      "detail": own}})
    # a part measured alone (--only) shows its own machine's rates: 284.6 -> 285, 20.86 -> 20.9, 57.9 -> 58
    assert ("| start-up to the first step, warm, s | 16.5 | f1b690e, 2026-12-02 (machine: 285 GFLOP/s, 20.9 GB/s, "
            "58 M/s) |") in table


def test_evict_page_cache_advises_every_file(tmp_path):
    (tmp_path / "a").write_text("x")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "b").write_bytes(b"\0" * 8192)
    assert headline.evict_page_cache([tmp_path]) == 2
    assert (tmp_path / "d" / "b").read_bytes() == b"\0" * 8192  # contents untouched


def test_ceiling_gives_the_runs_training_over_its_ceiling_for_the_pairs(tmp_path, monkeypatch):
    import ceiling

    # fixed machine rates instead of timings: 100 GFLOP/s for every matmul, 10 GB/s copy
    monkeypatch.setattr(ceiling, "measure", lambda threads, repeats, size, device="cpu": {
        f"{p} square {size}": 1e11 for p in ("fp32", "bf16")} | {
        f"{p} {ceiling.MODEL_SHAPE}": 1e11 for p in ("fp32", "bf16")} | {"copy bandwidth": 1e10})
    (tmp_path / "config.yaml").write_text("algorithm: grpo\n")
    recs = [{"rows": 8, "sampled_rows": 8, "prompt_tokens": 800, "response_length_mean": 100.0, "time_train": t,
             "time_rollout": r} for t, r in ((3.0, 20.0), (5.0, 12.0), (4.0, 14.0))]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    res = ceiling.main(["--P", "2", "--G", "4", "--threads", "2", "--metrics", str(tmp_path / "metrics.jsonl")])
    # the median training time (4.0 s) over the fp32 ceiling of training (forward+backward, reference, optimizer)
    assert res["train_over_ceiling"] == pytest.approx(4.0 / ceiling.train_ceiling(res))
    assert ceiling.train_ceiling(res) > 0
    # the rollout's bound: decode reads the weights once per step, 100 steps x 134.5M parameters x 4 bytes
    # at 10 GB/s = 100 x 0.538 GB / 10 GB/s = 5.38 s (its FLOPs at 100 GFLOP/s take far less), plus prefill
    # at the matmul rate; the median rollout (14.0 s) over their sum
    decode = res["ceiling_fp32"]["rollout: decode"]
    assert decode == pytest.approx(100 * ceiling.SMOLLM2_135M.params * 4 / 1e10) and 5.3 < decode < 5.45
    prefill = res["ceiling_fp32"]["rollout: prefill"]
    assert res["rollout_over_bound"] == pytest.approx(14.0 / (prefill + decode))
