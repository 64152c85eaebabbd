"""engine.vllm_compile: vLLM's compiled CPU forward in place of the eager one, and the sync stays exact."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from _engine_helpers import metrics, run_train

from policyzoo.engine.rollout.vllm_options import cpu_compile_cache_loads, llm_kwargs
from policyzoo.errors import ConfigError
from policyzoo.run_config import load_config

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


def test_a_cached_cpu_graph_gets_the_no_op_finalize_vllm_calls_after_loading(monkeypatch):
    import torch.compiler

    def plain_graph(*args):  # what inductor's whole-forward compilation (vLLM's CPU mode) deserialises to
        return args

    class Piecewise:  # vLLM's own serialisable graph keeps its method
        def finalize_loading(self, vllm_config):
            self.finalized = vllm_config

    made = iter([plain_graph, Piecewise()])
    monkeypatch.setattr(torch.compiler, "load_compiled_function",
                        lambda f, **kw: SimpleNamespace(_artifacts=SimpleNamespace(compiled_fn=next(made))))
    cpu_compile_cache_loads()
    cpu_compile_cache_loads()  # idempotent: one wrapper
    assert torch.compiler.load_compiled_function.policyzoo_finalize is True
    first = torch.compiler.load_compiled_function(None, f_globals={})._artifacts.compiled_fn
    assert first is plain_graph and first.finalize_loading("config") is None
    second = torch.compiler.load_compiled_function(None)._artifacts.compiled_fn
    second.finalize_loading("config")
    assert second.finalized == "config"  # not replaced


@pytest.mark.engine_group  # compiles the tiny model's forward (a minute or two): make test-engine
def test_a_compiled_engine_samples_and_scores_exactly_and_a_second_run_loads_it(tmp_path, monkeypatch):
    # TINY_OVERRIDES run the sync check after every push with tolerance 1e-4 nats (a failed check stops the
    # run); lr 1e-3 moves the tiny model's log-probs by far more than that in one step, so an engine whose
    # compiled graph kept the old weights would fail it. The second run starts from the first's compile
    # cache (its own VLLM_CACHE_ROOT, empty before the first) and must load, not compile, the same graph.
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache"))
    for name, how in (("run", "compiled at this start"), ("again", "loaded from its compile cache")):
        proc = run_train(tmp_path / name, "train.steps=2", "engine.vllm_compile=true", timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"vLLM's compiled forward: {how}" in proc.stderr, proc.stderr[-3000:]
        steps = metrics(tmp_path / name)
        assert [s["step"] for s in steps] == [1, 2]
        assert all(s["sync_max_diff"] <= 1e-4 for s in steps)
        assert steps[0]["grad_norm"] > 0  # the weights did change before the check
    assert list((tmp_path / "vllm-cache").glob("torch_compile_cache/torch_aot_compile/*/rank_0_0/model"))


def test_vllm_cache_is_under_the_policyzoo_cache_and_keyed_by_the_cpu(tmp_path, monkeypatch):
    import platform

    import torch

    from policyzoo.engine.process import vllm_cache_dir

    monkeypatch.setenv("POLICYZOO_CACHE", str(tmp_path))
    # e.g. x86_64-AVX2 here, x86_64-AVX512 on another host: two folders, never one graph for both
    expected = tmp_path / "vllm" / f"{platform.machine()}-{torch.backends.cpu.get_cpu_capability()}"
    assert vllm_cache_dir() == expected
