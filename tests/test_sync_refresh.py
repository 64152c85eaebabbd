"""The weight sync rebuilds only the CPU GEMM handlers a push leaves stale
(policyzoo.engine.sync.stale_gemm_modules): the LM head that keeps its (tied) weight,
never the input embedding's handler, which is never called, nor the linear layers vLLM rebuilds
itself. vLLM's module classes are stood in for by classes of the same name. The sync's exactness
on a real vLLM engine: tests/test_engine_vllm.py."""

from __future__ import annotations

import torch

from policyzoo.engine.sync import stale_gemm_modules


class VocabParallelEmbedding(torch.nn.Module):
    def __init__(self, weight):
        super().__init__()
        self.weight = weight
        self.cpu_linear = object()  # built at load; only called when the module is the LM head


class ParallelLMHead(VocabParallelEmbedding):
    pass


class RowParallelLinear(torch.nn.Module):  # vLLM empties a linear layer's weight after packing it
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)
        self.cpu_linear = object()


class Model(torch.nn.Module):
    def __init__(self, tied: bool, head_is_embedding: bool = False):
        super().__init__()
        w = torch.nn.Parameter(torch.randn(10, 4), requires_grad=False)
        self.embed_tokens = VocabParallelEmbedding(w)
        self.proj = RowParallelLinear()
        self.norm = torch.nn.LayerNorm(4)  # a 1-D weight and no handler
        self.lm_head = self.embed_tokens if head_is_embedding else ParallelLMHead(
            w if tied else torch.nn.Parameter(torch.randn(10, 4), requires_grad=False))


def test_the_head_only_tied_or_not():
    for tied in (True, False):
        m = Model(tied=tied)
        assert stale_gemm_modules(m) == [m.lm_head]  # not the embedding, not the emptied linear


def test_a_head_that_is_the_embedding_module_is_kept():
    m = Model(tied=True, head_is_embedding=True)  # e.g. a quantized tie returning the embedding itself
    assert stale_gemm_modules(m) == [m.embed_tokens]
