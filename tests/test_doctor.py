"""``policyzoo doctor --gpu`` on CPU without running a part: pass/fail against the tolerances, the report's
format, the dry run's plan and time bound, the usage errors, a plan whose parts are all skipped."""

from __future__ import annotations

import json
import math

import pytest

from policyzoo.cli import main
from policyzoo.doctor import runner as command
from policyzoo.doctor.parts import SHAPE_135M, build_shape
from policyzoo.doctor.plan import ERROR, FAIL, FULL, PASS, SKIPPED, Limit, Part, judge, overall, plan_for
from policyzoo.doctor.report import render
from policyzoo.doctor.runner import part_env, run_part, run_plan

BF16 = Part("zero3_bf16", 75, "bf16 steps", (Limit("sync_max_diff", 0.25, "sync, bf16"),
                                             Limit("share_prompt_max_diff", 0.1, "shared prompt, bf16")))


def test_each_limit_passes_at_or_below_its_tolerance_only():
    assert judge(BF16, {"sync_max_diff": 0.25, "share_prompt_max_diff": 0.1}).status == PASS  # equal: inside
    v = judge(BF16, {"sync_max_diff": 0.26, "share_prompt_max_diff": 0.05})
    assert v.status == FAIL and [c.ok for c in v.checks] == [False, True]
    assert v.checks[0].text() == "sync_max_diff 0.26 > 0.25 FAIL"
    assert v.checks[1].text() == "share_prompt_max_diff 0.05 <= 0.1 pass"
    # NaN, a missing value and a non-number fail; a bool is no measurement
    assert judge(BF16, {"sync_max_diff": math.nan, "share_prompt_max_diff": 0.0}).status == FAIL
    missing = judge(BF16, {"sync_max_diff": 0.1})
    assert missing.status == FAIL and missing.checks[1].text() == "share_prompt_max_diff missing FAIL"
    assert judge(BF16, {"sync_max_diff": True, "share_prompt_max_diff": 0.0}).status == FAIL
    assert judge(BF16, {"error": "timed out after 75 s"}).status == ERROR
    assert judge(BF16, {"skipped": "needs 2 or more CUDA GPUs, 0 visible"}).status == SKIPPED


def test_overall_fails_on_a_failure_or_an_error_never_on_a_skip():
    ok, skip = judge(BF16, {"sync_max_diff": 0.0, "share_prompt_max_diff": 0.0}), judge(BF16, {"skipped": "x"})
    assert overall([ok, skip]) == PASS
    assert overall([ok, judge(BF16, {"error": "boom"})]) == FAIL
    assert overall([skip, judge(BF16, {"sync_max_diff": 1.0, "share_prompt_max_diff": 0.0})]) == FAIL


def test_the_report_holds_versions_devices_each_part_and_the_command():
    probe = Part("probe", 30, "versions")
    ranks = Part("ranks", 45, "ranks", (Limit("rank_device_mismatches", 0, "ranks"),), min_gpus=2)
    results = {"probe": {"policyzoo": "0.1.0", "torch": "2.13.0", "cuda": "12.8", "gpus": 1, "bf16": True,
                         "devices": [{"index": 0, "name": "NVIDIA H200", "memory_gib": 139.8, "capability": "9.0"}],
                         "wall_s": 2.0},
               "zero3_bf16": {"sync_max_diff": 0.3, "share_prompt_max_diff": 0.0123456, "step_s": 1.5, "wall_s": 12.5},
               "ranks": {"skipped": "needs 2 or more CUDA GPUs, 1 visible", "wall_s": 0.0}}
    verdicts = [judge(probe, results["probe"]), judge(BF16, results["zero3_bf16"]), judge(ranks, results["ranks"])]
    meta = {"command": "policyzoo doctor --gpu --out d", "device": "cuda", "wall_s": 14.5, "bound_s": 150,
            "budget_s": 600, "overall": overall(verdicts)}
    lines = render(meta, verdicts, results).splitlines()
    assert lines[0] == "# policyzoo doctor --gpu: FAIL"
    assert "- command: `policyzoo doctor --gpu --out d`" in lines
    assert "- parts: 1 pass, 1 FAIL, 0 ERROR, 1 skipped" in lines
    assert "| torch | 2.13.0 |" in lines and "| cuda | 12.8 |" in lines and "| vllm | - |" in lines
    assert "| 0 | NVIDIA H200 | 139.8 | 9.0 |" in lines
    # 0.3 > 0.25 fails; 0.0123456 printed with 4 significant digits, inside 0.1; a wall time of 0.0 s as "0"
    assert "| zero3_bf16 | FAIL | 12.5 | sync_max_diff 0.3 > 0.25 FAIL; share_prompt_max_diff 0.01235 <= 0.1 pass |" \
        in lines
    assert "| ranks | skipped | 0 | needs 2 or more CUDA GPUs, 1 visible |" in lines
    assert "- step_s: 1.5" in lines and "- tolerance: sync_max_diff <= 0.25 (sync, bf16)" in lines


def test_an_error_is_shown_in_full():
    v = judge(BF16, {"error": "policyzoo train exited 1: ModuleNotFoundError: No module named 'httpx'\ntrace"})
    meta = {"command": "c", "device": "cpu", "wall_s": 1.0, "bound_s": 75, "budget_s": 480, "overall": overall([v])}
    text = render(meta, [v], {"zero3_bf16": {"error": v.reason, "wall_s": 1.0}})
    row = "| zero3_bf16 | ERROR | 1 | policyzoo train exited 1: ModuleNotFoundError: No module named 'httpx' |"
    assert row in text
    assert "## Errors\n\n### zero3_bf16\n\n```\npolicyzoo train exited 1" in text and "\ntrace\n```" in text


def test_dry_run_lists_the_parts_and_the_time_bound(capsys):
    assert main(["doctor", "--gpu", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "the full plan on cuda, 8 parts" in out
    for part in ("probe", "tiny_model", "zero0_fp32", "zero3_bf16", "ranks", "zero3_ranks", "step_135m", "trl_step"):
        assert f"\n  {part} " in out
    # 30 + 30 + 75 + 75 + 45 + 120 + 120 + 90 = 585 s, under 10 minutes
    assert "total: at most 585 s (each part its own process and timeout; bound 600 s)" in out
    assert "pass: sync_max_diff <= 0.25 (sync check, bfloat16" in out
    assert "pass: sync_max_diff <= 0.001 (sync check, float32" in out


def test_on_cpu_the_trainer_subset_compiles_deepspeeds_op_first(capsys):
    assert main(["doctor", "--gpu", "--device", "cpu", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "the trainer subset on cpu, 5 parts" in out and "deepspeed_op <= 150 s" in out
    # 30 + 150 + 30 + 75 + 75 = 360 s, under 8 minutes
    assert "total: at most 360 s (each part its own process and timeout; bound 480 s)" in out
    assert [p.name for p in plan_for(True, "cpu")] == ["probe", "deepspeed_op", "tiny_model", "zero0_fp32",
                                                       "zero3_bf16"]
    assert sum(p.timeout_s for p in plan_for(False, "cuda")) <= 600 and max(p.timeout_s for p in FULL) <= 600


def test_usage_errors_exit_2_and_name_the_fix(capsys, monkeypatch):
    assert main(["doctor"]) == 2
    assert "fix: add --gpu" in capsys.readouterr().err
    monkeypatch.setattr(command, "cuda_problem", lambda: "torch 2.13.0+cpu (a CPU-only build) sees no CUDA GPU")
    assert main(["doctor", "--gpu", "--out", "unused"]) == 2
    cap = capsys.readouterr()
    assert "sees no CUDA GPU" in cap.err and "--device cpu" in cap.err
    assert "probe" not in cap.out  # the error comes first: no plan printed before it
    # a dry run without a GPU prints the plan and says that it is for a CUDA node
    assert main(["doctor", "--gpu", "--dry-run"]) == 0
    assert "note: torch 2.13.0+cpu (a CPU-only build) sees no CUDA GPU here" in capsys.readouterr().out
    # --trainer-only implies --gpu
    assert main(["doctor", "--trainer-only", "--device", "cpu", "--dry-run"]) == 0
    assert "the trainer subset on cpu, 5 parts" in capsys.readouterr().out


def test_parts_that_cannot_run_here_are_skipped_and_reported(tmp_path):
    parts = (Part("ranks", 45, "ranks", min_gpus=2), Part("trl_step", 90, "trl", needs=("no_such_module_xyz",)))
    seen = []
    verdicts = run_plan(parts, tmp_path, "cpu", "policyzoo doctor --gpu", 600, echo=seen.append)
    assert [v.status for v in verdicts] == [SKIPPED, SKIPPED] and len(seen) == 2
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["overall"] == PASS and data["bound_s"] == 135  # 45 + 90
    assert data["parts"]["ranks"]["skipped"] == "needs 2 or more CUDA GPUs, 0 visible"
    assert data["parts"]["trl_step"]["skipped"] == "not installed: no_such_module_xyz"
    assert "| trl_step | skipped | 0 | not installed: no_such_module_xyz |" in (tmp_path / "report.md").read_text()


def test_help_names_the_options(capsys):
    with pytest.raises(SystemExit) as done:
        main(["doctor", "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0
    assert all(o in out for o in ("--gpu", "--trainer-only", "--device {cuda,cpu}", "--out", "--dry-run"))


def test_a_part_runs_in_its_own_process_and_an_unknown_one_is_an_error(tmp_path):
    import torch

    probe = run_part(Part("probe", 120, "versions"), tmp_path, part_env("cpu"))  # no GPU visible to the part
    assert probe["gpus"] == 0 and probe["devices"] == [] and probe["torch"] == torch.__version__
    assert probe["wall_s"] > 0
    bad = run_part(Part("no_such_part", 120, "-"), tmp_path, part_env("cpu"))
    assert bad["error"] == "KeyError: 'no_such_part'"


def test_the_shape_models_tokenizer_decodes_every_id(tmp_path):
    from transformers import AutoTokenizer

    shape = dict(SHAPE_135M, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1, vocab_size=300)
    folder = build_shape(tmp_path / "m", shape)
    assert json.loads((folder / "config.json").read_text())["vocab_size"] == 300
    tok = AutoTokenizer.from_pretrained(str(folder))
    assert len(tok) == 300  # 3 specials + 256 bytes + 41 fillers x259..x299
    assert tok.decode([299]) == "x299" and tok.eos_token_id == tok.pad_token_id == 2
    ids = tok.encode("hi", add_special_tokens=False)
    assert len(ids) == 2 and all(3 <= i < 259 for i in ids) and tok.decode(ids) == "hi"  # one byte, one token


def test_read_run_takes_the_maxima_the_last_steps_split_and_counts_skipped_steps(tmp_path):
    from policyzoo.doctor.parts import read_run

    rows = [{"kind": "train", "sync_max_diff": 0.01, "time_step": 9.0, "time_rollout": 6.0, "time_train": 2.5,
             "time_sync": 0.5, "gpu_peak_allocated_gib": 3.0, "skipped": 0},
            {"kind": "eval", "sync_max_diff": 7.0},  # not a training step: left out
            {"kind": "train", "sync_max_diff": 0.03, "time_step": 2.0, "time_rollout": 1.25, "time_train": 0.5,
             "time_sync": 0.25, "gpu_peak_allocated_gib": 2.0, "skipped": 1}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (tmp_path / "summary.json").write_text(json.dumps({"share_prompt_check": {"max_diff": 0.002}, "zero_stage": 1}))
    got = read_run(tmp_path)
    # 2 train rows; sync max over them max(0.01, 0.03) = 0.03 (the eval row's 7.0 is not a step); the last
    # step's time and split 2.0 = 1.25 + 0.5 + 0.25; GPU peak max(3.0, 2.0) = 3.0; skipped 0 + 1 = 1
    assert got["steps"] == 2 and got["sync_max_diff"] == 0.03 and got["share_prompt_max_diff"] == 0.002
    assert (got["step_s"], got["rollout_s"], got["train_s"], got["sync_s"]) == (2.0, 1.25, 0.5, 0.25)
    assert got["gpu_peak_allocated_gib"] == 3.0 and got["skipped_steps"] == 1 and got["gpu_kv_cache_gib"] is None


def test_the_shape_models_logits_have_the_chosen_spread(tmp_path):
    """A logit is <h, e_j> with h the final RMS-normed state (per-coordinate RMS 1, norm weights 1) and e_j
    an embedding row with entries N(0, (0.02 x scale)^2), scale = 4 / (0.02 sqrt(hidden)): its variance is
    hidden x 0.02^2 x scale^2 = 16, std 4 (the default init alone: 0.02 x sqrt(64) = 0.16)."""
    import torch
    from transformers import AutoModelForCausalLM

    from policyzoo.doctor.parts import LOGIT_STD

    shape = dict(SHAPE_135M, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, vocab_size=300)
    model = AutoModelForCausalLM.from_pretrained(str(build_shape(tmp_path / "m", shape)), dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.arange(3, 40)[None]).logits[0]
    assert LOGIT_STD == 4.0
    assert 3.0 < logits.std(-1).mean().item() < 5.0  # std 4 within sampling noise of 300 ids x 37 positions
    # a peaked distribution: mean entropy well under the uniform ln 300 = 5.70 nats
    assert logits.log_softmax(-1).exp().mul(-logits.log_softmax(-1)).sum(-1).mean().item() < 4.5
