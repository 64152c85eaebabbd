"""The GPU profile's DeepSpeed settings train through policyzoo's step (on CPU, the tiny model): bf16 weights at
ZeRO 1 with ``data_types.grad_accum_dtype`` and ``communication_data_type`` fp32, the config the profile merges into
``engine.deepspeed`` on a GPU (``policyzoo.engine.run.gpu_profile.FP32_GRADIENTS``), with two micro-batches
accumulated by the step. DeepSpeed 0.19 then trains with its ``BF16_Optimizer`` (fp32 master weights and fp32
gradient accumulators), which its start-up log names."""

from __future__ import annotations

import json
import math

from _engine_helpers import metrics, run_train

from policyzoo.engine.run.gpu_profile import FP32_GRADIENTS


def test_the_profiles_deepspeed_config_trains_bf16_with_fp32_gradients(tmp_path):
    out = tmp_path / "run"
    # the helpers' sync tolerance 1e-4 is fp32's; bf16 sampling against bf16 training: the bf16 default 0.25
    proc = run_train(out, "train.steps=2", "model.dtype=bfloat16", "engine.zero_stage=1", "train.micro_batches=2",
                     "engine.sync_tolerance=0.25",
                     f"engine.deepspeed={json.dumps(FP32_GRADIENTS)}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    train = metrics(out)
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        assert r["skipped"] == 0 and math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0
    log = (out / "startup.log").read_text()
    assert "begin bf16_optimizer" in log  # DeepSpeed's engine chose BF16_Optimizer: bf16 + fp32 grad accumulation
    resolved = (out / "config.yaml").read_text()
    assert "grad_accum_dtype: fp32" in resolved and "communication_data_type: fp32" in resolved
