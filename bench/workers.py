"""Worker processes for bench/step_vs_trl.py and bench/scaling.py: one framework per process,
driven one optimizer step at a time over stdin/stdout.

Protocol: the parent writes ``step`` (or ``stop``) lines to the worker's stdin; the worker answers
each with one line ``@@BENCH {json}`` on stdout (anything else on stdout is library noise and is
ignored). The first answer, after the models are loaded, is ``{"ready": ...}``. Between commands a
worker blocks on stdin, so it uses no CPU while the other framework steps.

* ``policyzoo``: ``session.prepare`` + ``session.start`` (DeepSpeed trainer + vLLM rollout, as
  ``policyzoo train`` does), then ``policyzoo.step.train_step`` per command.
* ``trl``: ``GRPOTrainer.train()`` with a callback that waits for the command before each step and
  reports after it; generation and reward time are measured by wrapping the trainer's own
  ``_generate_single_turn`` and ``_calculate_rewards``. The prompts are the rows policyzoo draws
  (``batch_at``, in order, ``shuffle_dataset=False``) and the reward is policyzoo's reward
  components called on TRL's completions, so both frameworks see the same prompts and scorer.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time

TAG = "@@BENCH "


def emit(rec: dict) -> None:
    sys.stdout.write(TAG + json.dumps(rec) + "\n")
    sys.stdout.flush()


def wait_command() -> str:
    line = sys.stdin.readline()
    return line.strip() or "stop"


class PeakRSS:
    """Samples this process's RSS every 20 ms; ``window()`` returns the peak since the last call."""

    def __init__(self):
        import psutil

        self._proc, self._peak, self._stop = psutil.Process(), 0, False
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while not self._stop:
            self._peak = max(self._peak, self._proc.memory_info().rss)
            time.sleep(0.02)

    def window(self) -> float:
        peak, self._peak = self._peak, self._proc.memory_info().rss
        return peak / 2**30


def build_config(a):
    """The policyzoo config both workers derive their settings from."""
    from policyzoo.run_config import load_config

    over = [f"train.steps={a.steps}", f"train.prompts_per_step={a.P}", f"train.lr={a.lr}", f"train.seed={a.seed}",
            f"algorithm.sample.n={a.G}", f"algorithm.sample.max_tokens={a.max_tokens}",
            f"engine.threads={a.threads}", f"output_dir={a.run_dir}", f"model.dtype={a.dtype}",
            f"engine.rollout={a.rollout}"]
    if a.dtype == "bfloat16":  # bf16 trains at ZeRO >= 1 (policyzoo refuses ZeRO 0); an --override may raise it
        over.append("engine.zero_stage=1")
    return load_config(None, a.algo, over + list(a.override or []))


def policyzoo_worker(a) -> None:
    from policyzoo.engine.process import setup_process

    cfg = build_config(a)
    setup_process(cfg.engine.threads, cfg.engine.kv_cache_gb)
    from policyzoo.data import batch_at
    from policyzoo.engine.run.session import prepare, start
    from policyzoo.step import step_seed, train_step

    mem = PeakRSS()
    t0 = time.perf_counter()
    s = start(prepare(cfg, None))
    batches = 0

    def next_prompts():
        nonlocal batches
        rows = batch_at(s.task.train_rows, cfg.train.prompts_per_step, s.task.seed, batches)
        batches += 1
        return rows

    emit({"ready": True, "startup_s": time.perf_counter() - t0, "rss_gib": mem.window(),
          "startup_parts": s.startup.parts, "preload_s": s.startup.preload_s,
          "prompt_counts_s": s.prompt_counts.get("seconds")})
    step = 0
    while wait_command() == "step":
        step += 1
        t0 = time.perf_counter()
        m = train_step(s.run, s.policy, next_prompts, seed=step_seed(cfg.train.seed, step), settings=s.settings)
        wall = time.perf_counter() - t0
        tokens = m["response_length_mean"] * m["rows"]
        emit({"step": step, "time_step": wall, "time_rollout": m.get("time_rollout", 0.0),
              "time_reward": m.get("time_reward", 0.0), "time_train": m.get("time_train", 0.0),
              "time_sync": m.get("time_sync", 0.0), "rollout_tokens": tokens,
              "rollout_tokens_per_s": tokens / m["time_rollout"] if m.get("time_rollout") else 0.0,
              "reward_mean": m["reward_mean"], "loss": m.get("loss"), "peak_rss_gib": mem.window()})
    emit({"done": True, "max_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20})


def trl_settings(run, max_tokens: int) -> dict:
    """GRPOConfig arguments that reproduce policyzoo's loss for ``run`` (see docs/benchmarks.md)."""
    loss_type = {"seq_mean_token_mean": "grpo", "token_mean": "dapo", "token_sum_norm": "dr_grpo"}[run.reduce.name]
    clip = run.clip.params
    kw = dict(loss_type=loss_type, epsilon=clip.eps_low, epsilon_high=clip.eps_high,
              beta=run.kl.params.beta if run.kl is not None else 0.0, use_bias_correction_kl=False,
              scale_rewards="group" if run.baseline.name == "group_norm" else "none",
              importance_sampling_level="sequence" if run.ratio.name == "sequence" else "token")
    if run.kl is not None and (run.kl.name != "k3" or run.kl.params.placement != "loss"):
        raise SystemExit("TRL has only k3 in the loss")
    return kw


def trl_precision_args(dtype: str) -> dict:
    """TRL's precision for ``--dtype``: its default, fp32 weights and AdamW state with bf16 autocast for
    ``bfloat16`` (on a GPU and on the CPU alike), fp32 for ``float32``
    (:func:`policyzoo.doctor.trl_step.trl_precision`). It once loaded the model in bf16, so TRL trained pure
    bf16 weights while policyzoo kept fp32 master weights: bench/results/gpu_h200/README.md."""
    from policyzoo.doctor.trl_step import trl_precision

    return trl_precision(dtype == "bfloat16")


def trl_worker(a) -> None:
    import torch

    torch.set_num_threads(a.threads)
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from policyzoo.assembly import Run, reward_uses
    from policyzoo.contract import Rollout
    from policyzoo.data import batch_at, load_task
    from policyzoo.engine.models import resolve_model
    from policyzoo.resolve import resolve_algorithm
    from policyzoo.step import dispatch

    cfg = build_config(a)
    mem = PeakRSS()
    t_start = time.perf_counter()
    task = load_task(cfg.data)
    run = Run(resolve_algorithm(cfg.algorithm), rewards=reward_uses(cfg, task.default_rewards))
    model = resolve_model(cfg.model.path)
    P, G = cfg.train.prompts_per_step, run.sample.params.n
    rows = [r for k in range(cfg.train.steps) for r in batch_at(task.train_rows, P, task.seed, k)]
    ds = Dataset.from_list([{"prompt": r["prompt"], "row_index": i} for i, r in enumerate(rows)])

    def reward(prompts, completions, completion_ids, row_index, **_):
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        b, width = len(texts), max(1, max(len(c) for c in completion_ids))
        ids = torch.zeros(b, width, dtype=torch.long)
        mask = torch.zeros(b, width, dtype=torch.bool)
        for i, c in enumerate(completion_ids):
            ids[i, :len(c)], mask[i, :len(c)] = torch.tensor(c, dtype=torch.long), True
        roll = Rollout(prompt_ids=[[0]] * b, response_ids=ids, response_mask=mask,
                       rollout_logprobs=torch.zeros(b, width),
                       group_ids=torch.arange(b) // G, truncated=torch.zeros(b, dtype=torch.bool),
                       prompts=[""] * b, completions=texts, rows=[rows[i] for i in row_index],
                       max_tokens=run.sample.params.max_tokens)
        total = torch.zeros(b)
        for comp, v in dispatch.call_each(run, "reward", rows=b, rollout=roll):
            total = total + comp.params.weight * torch.as_tensor(v, dtype=torch.float32)
        return total.tolist()

    # --trl-vllm: TRL's own vLLM integration, colocated like ours (the closest TRL gets to our engine)
    trl_vllm = dict(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3,
                    vllm_importance_sampling_correction=False) if a.trl_vllm else {}
    if a.trl_cb:  # --trl-cb: transformers' continuous batching (paged KV cache), TRL's non-vLLM fast path
        trl_vllm["use_transformers_continuous_batching"] = True
    args = GRPOConfig(
        output_dir=a.run_dir + "-trl", use_cpu=not torch.cuda.is_available(), report_to=[], save_strategy="no",
        disable_tqdm=True,
        per_device_train_batch_size=P * G, num_generations=G, gradient_accumulation_steps=1,
        max_completion_length=run.sample.params.max_tokens, temperature=run.sample.params.temperature,
        learning_rate=cfg.train.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=cfg.train.weight_decay,
        max_grad_norm=cfg.train.grad_clip, max_steps=cfg.train.steps, logging_steps=1, seed=cfg.train.seed,
        shuffle_dataset=False, **trl_precision_args(a.dtype),
        **trl_settings(run, run.sample.params.max_tokens), **trl_vllm)
    timing = {"gen": 0.0, "reward": 0.0, "tokens": 0}

    class Drive(TrainerCallback):
        def on_step_begin(self, args_, state, control, **kw):
            if wait_command() != "step":
                control.should_training_stop = True
                emit({"done": True, "max_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20})
                os._exit(0)
            timing.update(gen=0.0, reward=0.0, tokens=0, t0=time.perf_counter())

        def on_step_end(self, args_, state, control, **kw):
            timing["wall"] = time.perf_counter() - timing["t0"]

        def on_log(self, args_, state, control, logs=None, **kw):
            if logs is None or "reward" not in logs or "wall" not in timing:
                return
            w, g = timing.pop("wall"), timing["gen"]
            emit({"step": state.global_step, "time_step": w, "time_rollout": g, "time_reward": timing["reward"],
                  "time_train": w - g - timing["reward"], "time_sync": 0.0, "rollout_tokens": timing["tokens"],
                  "rollout_tokens_per_s": timing["tokens"] / g if g else 0.0, "reward_mean": logs["reward"],
                  "loss": logs.get("loss"), "peak_rss_gib": mem.window()})

    trainer = GRPOTrainer(model=str(model.path), reward_funcs=reward, args=args, train_dataset=ds,
                          processing_class=model.tokenizer, callbacks=[Drive()])
    gen, score = trainer._generate_single_turn, trainer._calculate_rewards

    def timed_gen(*args_, **kw):
        t0 = time.perf_counter()
        out = gen(*args_, **kw)
        timing["gen"] += time.perf_counter() - t0
        timing["tokens"] += sum(len(c) for c in out[0])
        return out

    def timed_reward(*args_, **kw):
        t0 = time.perf_counter()
        out = score(*args_, **kw)
        timing["reward"] += time.perf_counter() - t0
        return out

    trainer._generate_single_turn, trainer._calculate_rewards = timed_gen, timed_reward
    emit({"ready": True, "startup_s": time.perf_counter() - t_start, "rss_gib": mem.window()})
    trainer.train()
    wait_command()
    emit({"done": True, "max_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20})


def add_common(ap) -> None:
    ap.add_argument("--algo", default="grpo", help="policyzoo bundle (TRL gets the matching loss settings)")
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps per framework")
    ap.add_argument("--P", type=int, default=2, help="prompts per step")
    ap.add_argument("--G", type=int, default=4, help="samples per prompt")
    ap.add_argument("--max-tokens", type=int, default=32, help="response token limit")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--rollout", default="vllm", choices=["vllm", "transformers"], help="policyzoo's rollout engine")
    ap.add_argument("--override", action="append", help="extra policyzoo key=value (repeatable)")
    ap.add_argument("--trl-cb", action="store_true", help="TRL generates with transformers' continuous "
                    "batching (use_transformers_continuous_batching=True)")
    ap.add_argument("--trl-vllm", action="store_true", help="TRL generates with its colocated vLLM "
                    "(use_vllm=True, vllm_mode='colocate'; its IS correction off: ours has none in grpo)")


def check_common(ap, a) -> None:
    if min(a.steps, a.P, a.G, a.max_tokens, a.threads) < 1:
        ap.error("steps, P, G, max-tokens and threads must be >= 1")
    if a.G < 2:
        ap.error("G must be >= 2 (group baselines)")
    if not a.lr > 0:
        ap.error("lr must be > 0")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="one benchmark worker (started by step_vs_trl.py / scaling.py)")
    ap.add_argument("framework", choices=["policyzoo", "trl"])
    ap.add_argument("--run-dir", required=True)
    add_common(ap)
    a = ap.parse_args()
    check_common(ap, a)
    (policyzoo_worker if a.framework == "policyzoo" else trl_worker)(a)
