"""engine.vllm_compile: vLLM's compiled CPU forward in place of the eager one, and the sync stays exact."""

from __future__ import annotations

import pytest
from _engine_helpers import metrics, run_train

from policyzoo.config import load_config
from policyzoo.engine.rollout.vllm_options import llm_kwargs
from policyzoo.errors import ConfigError

COMMON = dict(dtype="float32", max_model_len=512, seed=7, tokenizer="m")


def test_the_setting_chooses_the_cpu_forward_and_gpus_always_compile():
    assert llm_kwargs(on_cuda=False, **COMMON)["enforce_eager"] is True  # the default: eager
    assert llm_kwargs(on_cuda=False, compile_cpu=True, **COMMON)["enforce_eager"] is False
    assert llm_kwargs(on_cuda=True, compile_cpu=False, **COMMON)["enforce_eager"] is False  # CUDA graphs
    assert load_config(None, "grpo", []).engine.vllm_compile is False


def test_compile_without_the_vllm_rollout_is_refused():
    with pytest.raises(ConfigError) as e:
        load_config(None, "grpo", ["engine.vllm_compile=true", "engine.rollout=transformers"])
    assert "engine.rollout=vllm" in str(e.value)


@pytest.mark.engine_group  # compiles the tiny model's forward (a minute or two): make test-engine
def test_a_compiled_engine_samples_and_scores_exactly_after_each_weight_push(tmp_path):
    # TINY_OVERRIDES run the sync check after every push with tolerance 1e-4 nats (a failed check stops the
    # run); lr 1e-3 moves the tiny model's log-probs by far more than that in one step, so an engine whose
    # compiled graph kept the old weights would fail it
    proc = run_train(tmp_path / "run", "train.steps=2", "engine.vllm_compile=true", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = metrics(tmp_path / "run")
    assert [s["step"] for s in steps] == [1, 2]
    assert all(s["sync_max_diff"] <= 1e-4 for s in steps)
    assert steps[0]["grad_norm"] > 0  # the weights did change before the check
