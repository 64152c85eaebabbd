"""After a push into vLLM-CPU: the pre-packed GEMM kernels that a weight reload leaves stale (vLLM 0.32's
CPU linear layers, ``dispatch_cpu_unquantized_gemm``), found and rebuilt. The colocated engine's
``load_weights`` (``rollout/vllm_engine.py``) runs :func:`refresh_cpu_kernels` in its worker; the rollout
server's worker (``rollout/server/worker.py``) rebuilds :func:`stale_gemm_modules` at the end of a push."""

from __future__ import annotations

import torch


def stale_gemm_modules(model) -> list:
    """The modules of a vLLM-CPU model whose pre-packed GEMM handler a weight push leaves stale:
    those that keep their weight tensor after loading (vLLM 0.32 empties the weight of every
    linear layer, whose handler its ``reload_weights`` rebuilds itself; the LM head tied to the
    embedding keeps it and is not rebuilt). The input embedding is left out unless it is the
    model's ``lm_head`` itself: it looks tokens up and its GEMM handler is never called, so
    rebuilding it (a prepack of the whole vocabulary matrix) was wasted work. Whether a weight
    changed is not tested: vLLM's loader writes through ``param.data``, which bumps no version
    counter, and comparing values would read the matrix anyway."""
    head = getattr(model, "lm_head", None)
    out = []
    for module in model.modules():
        w = getattr(module, "weight", None)
        if not (hasattr(module, "cpu_linear") and isinstance(w, torch.Tensor) and w.dim() == 2 and w.numel() > 0):
            continue
        if type(module).__name__ == "VocabParallelEmbedding" and module is not head:
            continue
        out.append(module)
    return out


def refresh_cpu_kernels(worker) -> int:
    """Rebuild the stale CPU GEMM handlers (:func:`stale_gemm_modules`); returns how many."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return 0
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    stale = stale_gemm_modules(worker.model_runner.model)
    for module in stale:
        dispatch_cpu_unquantized_gemm(module, remove_weight=False)
    return len(stale)
