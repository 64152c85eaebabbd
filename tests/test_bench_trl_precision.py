"""The TRL side of the GPU A/B trains at TRL's default precision (issue 46, finding 7): fp32 weights and
AdamW state with bf16 autocast (accelerate's mixed precision), not a model loaded in bf16 (pure bf16
weights and AdamW state, which is other training than policyzoo's fp32 master weights). Checked on the CPU
with TRL's own trainer on the tiny model: one step, then the weights', gradients' and AdamW moments' dtypes."""

from __future__ import annotations

import sys

import pytest
import torch
from _engine_helpers import ROOT, tiny_model

from policyzoo.doctor.trl_step import trl_precision
from policyzoo.testing.tiny import spread_reward

pytest.importorskip("trl", reason="TRL comes with make setup (the bench extra)")


def test_the_bench_worker_asks_trl_for_its_default_precision():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from workers import trl_precision_args
    finally:
        sys.path.remove(str(ROOT / "bench"))
    fp32 = {"dtype": torch.float32}
    # bf16 runs: fp32 weights under bf16 autocast; fp32 runs: bf16 said off (TRL's default is on)
    assert trl_precision_args("bfloat16") == {"bf16": True, "fp16": False, "model_init_kwargs": fp32}
    assert trl_precision_args("float32") == {"bf16": False, "fp16": False, "model_init_kwargs": fp32}


@pytest.mark.parametrize("bf16", [True, False])
def test_trl_trains_fp32_master_weights_under_bf16_autocast(tmp_path, bf16):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir=str(tmp_path), report_to=[], save_strategy="no", disable_tqdm=True, use_cpu=True,
                      per_device_train_batch_size=4, num_generations=2, max_completion_length=4, learning_rate=1e-6,
                      max_steps=1, logging_steps=1, **trl_precision(bf16))
    data = Dataset.from_list([{"prompt": f"What is {i} + {i}?"} for i in range(8)])
    trainer = GRPOTrainer(model=str(tiny_model()), reward_funcs=spread_reward, args=args, train_dataset=data)
    assert trainer.accelerator.mixed_precision == ("bf16" if bf16 else "no")
    trainer.train()
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    assert {p.dtype for p in params} == {torch.float32}  # the master weights stay fp32 after a step
    moments = [s[k] for s in trainer.optimizer.state.values() for k in ("exp_avg", "exp_avg_sq")]
    assert moments and {m.dtype for m in moments} == {torch.float32}  # AdamW state fp32
