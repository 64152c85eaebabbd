"""The same step with TRL (optional part ``trl_step``): TRL's ``GRPOTrainer`` with transformers generate,
on the doctor's model, 2 steps of 2 prompts x 4 samples x 16 tokens, bf16 on the GPU. Reports the last
step's seconds and the GPU memory peak, beside policyzoo's ``step_135m`` (no pass/fail: a comparison). The
doctor runs it on a GPU only; on CPU (fp32, no memory figure) it runs too, which the tests use."""

from __future__ import annotations

import time
from pathlib import Path

from policyzoo.testing.tiny import spread_reward


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
                      bf16=cuda, use_cpu=not cuda,
                      model_init_kwargs={"dtype": torch.bfloat16 if cuda else torch.float32})
    data = Dataset.from_list([{"prompt": f"What is {i} + {i}?"} for i in range(16)])
    trainer = GRPOTrainer(model=str(model), reward_funcs=spread_reward, args=args, train_dataset=data,
                          callbacks=[Timer()])
    trainer.train()
    return {"trl": trl.__version__, "steps": len(times), "step_s": times[-1] if times else None,
            "gpu_peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None}
