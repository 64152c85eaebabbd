"""The engine's GPU paths on CPU: the executor per platform, one device per rank (threads included),
vLLM's sleep-mode call order, dtype tolerances and GPU memory metrics, with a fake ``torch.cuda``
and a fake ``vllm.LLM`` (no GPU here; what a GPU run must still confirm is in docs/engine.md)."""

from __future__ import annotations

import sys
import threading
import types

import pytest
import torch

from policyzoo.engine import device
from policyzoo.engine.dist import merge_metrics
from policyzoo.engine.lm_policy import LMPolicy
from policyzoo.engine.rollout.vllm_options import llm_kwargs
from policyzoo.engine.run.startup import Background
from policyzoo.engine.sync import Sleeper, WeightSync, run_with_timeout, sync_tolerance
from policyzoo.errors import ConfigError


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda reports 8 GPUs (a node under torchrun); set_device / empty_cache / memory calls are
    recorded per thread."""
    calls: list = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", d,
                                                                           threading.current_thread().name)))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(("empty_cache",)))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d: 5 * 2**30)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d: calls.append(("reset_peak", str(d))))
    monkeypatch.setenv("LOCAL_RANK", "3")
    return calls


def test_vllm_starts_per_platform():
    gpu = llm_kwargs(on_cuda=True, dtype="bfloat16", max_model_len=512, seed=7, tokenizer="m",
                     gpu_memory_utilization=0.4, sleep_level=1)
    # external_launcher: the worker takes RANK/LOCAL_RANK (uni would put every rank on cuda:0)
    assert gpu["distributed_executor_backend"] == "external_launcher"
    assert gpu["enforce_eager"] is False and gpu["gpu_memory_utilization"] == 0.4 and gpu["enable_sleep_mode"]
    assert "enable_chunked_prefill" not in gpu
    assert "enable_sleep_mode" not in llm_kwargs(on_cuda=True, dtype="bfloat16", max_model_len=512, seed=7,
                                                 tokenizer="m")
    cpu = llm_kwargs(on_cuda=False, dtype="float32", max_model_len=512, seed=7, tokenizer="m", sleep_level=0)
    assert cpu["distributed_executor_backend"] == "uni" and cpu["enforce_eager"] is True
    assert cpu["enable_chunked_prefill"] is False and "gpu_memory_utilization" not in cpu
    assert "enable_sleep_mode" not in cpu and "hf_overrides" not in cpu


def test_an_fp32_head_is_asked_of_vllm_only_over_other_weights():
    # engine.fp32_lm_head: vLLM's head_dtype override; over fp32 weights the head is fp32 already
    bf16 = llm_kwargs(on_cuda=False, dtype="bfloat16", max_model_len=512, seed=7, tokenizer="m", fp32_head=True)
    assert bf16["hf_overrides"] == {"head_dtype": "float32"} and bf16["dtype"] == "bfloat16"
    assert "hf_overrides" not in llm_kwargs(on_cuda=False, dtype="float32", max_model_len=512, seed=7, tokenizer="m",
                                            fp32_head=True)
    assert "hf_overrides" not in llm_kwargs(on_cuda=False, dtype="bfloat16", max_model_len=512, seed=7, tokenizer="m")


def test_every_engine_device_is_the_local_rank(fake_cuda, monkeypatch):
    assert device.local_device() == torch.device("cuda", 3)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device.local_device() == torch.device("cpu")


def test_engine_threads_set_their_device_first(fake_cuda):
    seen = []

    def work():
        seen.append(list(fake_cuda))  # what had been called when the work began
        return 1
    assert run_with_timeout(work, 5, "push") == 1
    assert Background(work).result() == 1
    # each helper thread called set_device(3) in itself before the work ran
    assert [c for c in seen[0] if c[0] == "set_device"] == [("set_device", 3, "policyzoo-push")]
    assert [c for c in seen[1] if c[0] == "set_device"][-1] == ("set_device", 3, "policyzoo-start")


def test_vllm_rollout_starts_external_launcher_and_reasserts_the_device(fake_cuda, monkeypatch, tmp_path):
    from policyzoo.engine.rollout.vllm_engine import VLLMRollout

    started = []

    class FakeLLM:
        def __init__(self, model, **kwargs):
            started.append(kwargs)
            fake_cuda.append(("llm_started",))

        def collective_rpc(self, fn):  # one worker that sized a 3 GiB KV cache
            return [fn(types.SimpleNamespace(available_kv_cache_memory_bytes=3 * 2**30))]
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=FakeLLM))
    info = types.SimpleNamespace(path=tmp_path, tokenizer=None)
    r = VLLMRollout(info, "bfloat16", 256, 0, 0.5, sleep_level=2)
    assert started[0]["distributed_executor_backend"] == "external_launcher"
    assert started[0]["enable_sleep_mode"] is True and r.sleeper.level == 2
    assert r.kv_cache_gib == 3.0  # metric gpu_kv_cache_gib
    # vLLM's worker sets the current device while it starts: the rank's device is set again after it
    assert fake_cuda.index(("llm_started",)) < fake_cuda.index(("set_device", 3, "MainThread"))


class FakeLLM:
    def __init__(self):
        self.calls = []

    def sleep(self, level):
        self.calls.append(f"sleep({level})")

    def wake_up(self, tags):
        self.calls.append(f"wake({tags[0]})")


class Rollout:
    """A rollout engine with vLLM's sleeper over a fake LLM; records what it was asked to do."""

    def __init__(self, level):
        self.llm = FakeLLM()
        self.sleeper = Sleeper(self.llm, level, release=lambda: self.llm.calls.append("empty_cache"))

    def generate(self, *args, **kwargs):
        self.sleeper.for_sampling()
        self.llm.calls.append("generate")
        return types.SimpleNamespace(response_mask=torch.ones(1, 1), prompt_ids=[[1]])

    def load_weights(self, weights):
        self.sleeper.for_push()
        self.llm.calls.append(f"push({len(list(weights))})")


class Trainer:
    import contextlib

    @contextlib.contextmanager
    def full_weights(self):
        yield [("w", torch.zeros(1)), ("b", torch.zeros(1))]

    def logprobs(self, rollout, grad, entropy=False, entropy_grad=False):
        return torch.zeros(1, 1), None

    def backward(self, loss, value_loss=None):
        pass


def _policy(level):
    r = Rollout(level)
    t = Trainer()
    return LMPolicy(r, t, WeightSync(r, t, check=False, tolerance=1e-3, timeout_s=5, check_ids=[1, 2])), r.llm.calls


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_order_sample_sleep_wake_weights_push_wake_kv(level):
    policy, calls = _policy(level)
    policy.generate([{"prompt": "x"}], 1, 4, 1.0, 0)  # step 1 samples (awake since start)
    policy.logprobs(None, grad=False)  # the trainer takes over: vLLM sleeps once
    policy.logprobs(None, grad=True)
    policy.backward(torch.zeros(()))
    policy.sync()  # weights woken (after the allocator's cache is released), then pushed
    policy.generate([{"prompt": "x"}], 1, 4, 1.0, 0)  # step 2: the KV cache back first
    assert calls == ["generate", f"sleep({level})", "empty_cache", "wake(weights)", "push(2)",
                     "wake(kv_cache)", "generate"]


def test_a_level_2_engine_is_pushed_before_it_samples_after_a_skipped_update():
    policy, calls = _policy(2)
    policy.generate([{"prompt": "x"}], 1, 4, 1.0, 0)
    policy.logprobs(None, grad=False)  # sleeps; the update is skipped, so no sync follows
    policy.generate([{"prompt": "x"}], 1, 4, 1.0, 0)  # level 2 dropped the weights: push them again
    assert calls == ["generate", "sleep(2)", "empty_cache", "wake(weights)", "push(2)", "wake(kv_cache)", "generate"]
    policy1, calls1 = _policy(1)
    policy1.generate([{"prompt": "x"}], 1, 4, 1.0, 0)
    policy1.logprobs(None, grad=False)
    policy1.generate([{"prompt": "x"}], 1, 4, 1.0, 0)  # level 1 kept them in host memory: waking is enough
    assert calls1 == ["generate", "sleep(1)", "wake(weights)", "wake(kv_cache)", "generate"]


def test_level_0_never_sleeps():
    policy, calls = _policy(0)
    policy.generate([{"prompt": "x"}], 1, 4, 1.0, 0)
    policy.logprobs(None, grad=False)
    policy.sync()
    assert calls == ["generate", "push(2)"]


def test_options_a_platform_cannot_run_are_config_errors():
    def engine(**kw):
        base = dict(rollout="vllm", vllm_sleep=0, overlap="none", parallel_start=False)
        return types.SimpleNamespace(**{**base, **kw})
    with pytest.raises(ConfigError, match="needs a CUDA GPU"):
        device.check_device_options(engine(vllm_sleep=1), on_cuda=False)
    with pytest.raises(ConfigError, match="parallel_start"):
        device.check_device_options(engine(parallel_start=True), on_cuda=True)
    with pytest.raises(ConfigError, match="overlap"):
        device.check_device_options(engine(vllm_sleep=2, overlap="one_step"), on_cuda=True)
    with pytest.raises(ConfigError, match="rollout engine is transformers"):
        device.check_device_options(engine(vllm_sleep=1, rollout="transformers"), on_cuda=True)
    device.check_device_options(engine(parallel_start=True), on_cuda=False)  # CPU start-up keeps it
    device.check_device_options(engine(vllm_sleep=2), on_cuda=True)


def test_tolerances_follow_the_dtype_and_the_check_logs_max_and_mean():
    assert sync_tolerance("float32") == 1e-3 and sync_tolerance("bfloat16") == 0.25
    assert sync_tolerance("bfloat16", 1e-2) == 1e-2  # engine.sync_tolerance wins

    class Engine:
        def score(self, ids):
            return torch.tensor([-1.0, -2.0]) + 0.5

        def score_next(self, ids):
            return {7: -0.5}

    class Scorer:
        def score_sequence(self, ids):
            return torch.tensor([-1.0, -2.0])

        def next_logprobs(self, ids):
            return torch.full((9,), -0.5)
    p = WeightSync(Engine(), Scorer(), check=True, tolerance=sync_tolerance("bfloat16"), timeout_s=5, check_ids=[1, 2])
    # differences 0.5, 0.5 (prompt path) and 0 (cached path): max 0.5 > 0.25 fails, mean 1/3
    with pytest.raises(Exception, match=r"up to 0.5 nats \(mean 0.333\)"):
        p.check_now()
    p.tolerance = 0.6
    assert p.check_now() == pytest.approx(0.5) and p.last_mean_diff == pytest.approx(1 / 3)


def test_gpu_memory_metrics_on_cuda_and_none_on_cpu(fake_cuda, monkeypatch):
    assert device.gpu_memory_metrics() == {"gpu_peak_allocated_gib": 3.0, "gpu_reserved_gib": 5.0}
    assert ("reset_peak", "cuda:3") in fake_cuda  # each step reports its own peak
    device.release_cached_memory()
    assert ("empty_cache",) in fake_cuda
    # ranks report their own GPU: the merged record keeps the largest
    merged = merge_metrics([{"gpu_peak_allocated_gib": 3.0, "gpu_reserved_gib": 5.0},
                            {"gpu_peak_allocated_gib": 4.0, "gpu_reserved_gib": 4.5}])
    assert merged == {"gpu_peak_allocated_gib": 4.0, "gpu_reserved_gib": 5.0}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    fake_cuda.clear()
    assert device.gpu_memory_metrics() == {}
    device.release_cached_memory()
    assert fake_cuda == []
