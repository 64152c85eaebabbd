"""The speed and memory options end to end on the tiny Llama (vLLM rollout, DeepSpeed, sync check
after every step): LoRA with the reference taken from the base model, gradient checkpointing,
bf16 autocast, token-budget micro-batches, the user's DeepSpeed config and vLLM started in parallel
with DeepSpeed, in one run."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
from _engine_helpers import ROOT, engine_env, metrics, run_train, tiny_model, train_cmd
from safetensors.torch import load_file


def test_lora_checkpointing_autocast_token_budget_and_user_deepspeed_config(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 1}, "gradient_accumulation_steps": "auto"}))
    out = tmp_path / "run"
    proc = run_train(out, "train.steps=2", "algorithm.sample.n=4", "model.lora={r: 4, alpha: 16}",
                     "train.gradient_checkpointing=true", "train.autocast=true",
                     "train.max_tokens_per_micro_batch=64", f"engine.deepspeed={ds}", "train.lr=1e-2",
                     "engine.parallel_start=true", "engine.trim_memory=true")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr
    train = metrics(out)
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        assert r["skipped"] == 0 and math.isfinite(r["loss"]) and "kl_ref" in r
        assert 0 < r["rss_gib"] <= r["peak_rss_gib"] and r["time_trim"] >= 0
        # vLLM got the merged weights W + scale B @ A: the check scores in fp32 on both sides
        assert r["sync_max_diff"] <= 1e-4
    # step 1 starts at the base model, which is also the reference: KL 0 (adapter B = 0 at start)
    assert abs(train[0]["kl_ref"]) < 1e-6
    summary = json.loads((out / "summary.json").read_text())
    assert summary["models_loaded"] == ["policy", "reference (base model, adapter off)"]
    assert summary["trainable_params"] == 16384  # r 4 x 2048 per layer x 2 layers (tests/test_compute.py)
    assert summary["zero_stage"] == 1  # from the user's DeepSpeed config
    parts = summary["startup_parts"]  # start-up, by part: they add up to startup_seconds
    assert set(parts) == {"trainer_s", "share_prompt_check_s", "rollout_engine_s", "resume_and_run_dir_s"}
    assert min(parts.values()) >= 0 and sum(parts.values()) == pytest.approx(summary["startup_seconds"])
    assert summary["process_to_ready_seconds"] > summary["startup_seconds"]  # + interpreter start and imports
    assert summary["process_to_ready_seconds"] > summary["startup_seconds"] + summary["preload_seconds"]
    assert 0 <= summary["prompt_counts"]["seconds"] < summary["preload_seconds"]
    assert summary["prompt_counts"]["counted"] + summary["prompt_counts"]["remembered"] >= 64  # data.limit 64
    # exported: the adapter, and a merged model that differs from the base where the adapter acts
    assert (out / "final" / "adapter" / "adapter_config.json").is_file()
    before = load_file(str(tiny_model() / "model.safetensors"))
    after = load_file(str(out / "final" / "model.safetensors"))
    assert sorted(after) == sorted(before)
    key = "model.layers.0.self_attn.q_proj.weight"
    assert float((after[key] - before[key]).abs().max()) > 0
    norm = "model.layers.0.input_layernorm.weight"  # not adapted: unchanged
    assert torch.equal(after[norm], before[norm])


def test_a_lora_run_resumes_exactly(tmp_path):
    # 3 steps straight, against 2 steps then --resume to 3: DeepSpeed's checkpoint holds the PEFT
    # model (base + adapter) and the adapter's AdamW state; step 3 must come out the same
    lora = ["algorithm.sample.n=4", "model.lora={r: 4, alpha: 16}", "train.lr=1e-2"]
    full, cut = tmp_path / "full", tmp_path / "cut"
    # the two runs are independent: started together, their start-ups overlap
    logs = [tmp_path / "full.err", tmp_path / "cut.err"]  # files, not pipes: a full pipe would stall a run
    procs = []
    for (out, steps), log in zip(((full, 3), (cut, 2)), logs):
        with log.open("w") as err_file:
            procs.append(subprocess.Popen(train_cmd(out, f"train.steps={steps}", *lora), env=engine_env(), cwd=ROOT,
                                          stdout=subprocess.DEVNULL, stderr=err_file, text=True))
    try:
        for p, log in zip(procs, logs):
            p.wait(600)
            assert p.returncode == 0, log.read_text()[-4000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(60)
    proc = subprocess.run([sys.executable, "-m", "policyzoo.cli", "train", "--resume", str(cut), "train.steps=3"],
                          env=engine_env(), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    a, b = metrics(full)[2], metrics(cut)[2]
    assert a["step"] == b["step"] == 3
    for key in ("loss", "reward_mean", "kl_ref", "grad_norm", "response_length_mean"):
        assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), key
    after_full = load_file(str(full / "final" / "model.safetensors"))
    after_cut = load_file(str(cut / "final" / "model.safetensors"))
    for k in after_full:
        assert torch.allclose(after_full[k], after_cut[k], atol=1e-6), k
