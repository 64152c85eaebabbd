"""The same step with TRL (optional part ``trl_step``): TRL's ``GRPOTrainer`` with transformers generate,
on the doctor's model, 2 steps of 2 prompts x 4 samples x 16 tokens, at TRL's default precision on the GPU
(:func:`trl_precision`). Reports the last step's seconds and the GPU memory peak, beside policyzoo's
``step_135m`` (no pass/fail: a comparison). The doctor runs it on a GPU only; on CPU (fp32, no memory
figure) it runs too, which the tests use."""

from __future__ import annotations

import time
from pathlib import Path

from policyzoo.testing.tiny import spread_reward


def trl_precision(bf16: bool) -> dict:
    """``GRPOConfig`` arguments for TRL's own default training precision: the model loaded in fp32
    (``model_init_kwargs={"dtype": torch.float32}``, TRL's default for a model path; transformers'
    ``from_pretrained`` would take the checkpoint's dtype) and, with ``bf16``, ``bf16=True`` (TRL's default
    when ``fp16`` is not set): accelerate's mixed precision, i.e. bf16 autocast over fp32 master weights,
    fp32 gradients and fp32 AdamW state. That is the training policyzoo's bf16 does too (DeepSpeed bf16:
    fp32 master weights and optimizer state), so a timing A/B compares like with like. Loading the model
    in bf16 instead trains pure bf16 weights and AdamW state: cheaper, and at lr 1e-6 most updates round
    away (bf16 keeps 8 significant bits: an update under half a step, 2^-9 to 2^-8 of the weight, is lost;
    AdamW moves a weight by about lr, 1e-6, against weights of ~1e-2). Without ``bf16``:
    fp32 throughout (``bf16=False`` said explicitly, since TRL's default is True).
    Source: TRL 1.16 ``GRPOConfig`` (``bf16`` default) and ``create_model_from_path`` (dtype default)."""
    import torch

    return {"bf16": bool(bf16), "fp16": False, "model_init_kwargs": {"dtype": torch.float32}}


def trl_step(model: Path, run_dir: Path) -> dict:
    """Run 2 TRL GRPO steps; returns ``{"trl": version, "steps", "step_s": seconds of the last step,
    "gpu_peak_allocated_gib": GiB, None on CPU}``. Raises what TRL raises (recorded as the part's error)."""
    import torch
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    times: list[float] = []
    cuda = torch.cuda.is_available()

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            times.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
            times[-1] = time.perf_counter() - times[-1]

    args = GRPOConfig(output_dir=str(run_dir), report_to=[], save_strategy="no", disable_tqdm=True,
                      per_device_train_batch_size=8, num_generations=4, gradient_accumulation_steps=1,
                      max_completion_length=16, learning_rate=1e-5, max_steps=2, logging_steps=1,
                      use_cpu=not cuda, **trl_precision(cuda))
    data = Dataset.from_list([{"prompt": f"What is {i} + {i}?"} for i in range(16)])
    trainer = GRPOTrainer(model=str(model), reward_funcs=spread_reward, args=args, train_dataset=data,
                          callbacks=[Timer()])
    trainer.train()
    return {"trl": trl.__version__, "steps": len(times), "step_s": times[-1] if times else None,
            "gpu_peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None}
