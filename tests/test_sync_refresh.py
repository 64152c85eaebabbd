"""The weight sync rebuilds only the stale CPU GEMM handlers (policyzoo.engine.rollout.engines.
stale_gemm_modules): the LM head when its weight changed, never the input embedding's unused one,
nothing when nothing changed. vLLM's module classes are stood in for by classes of the same name."""

from __future__ import annotations

import torch

from policyzoo.engine.rollout.engines import stale_gemm_modules


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
        self.lm_head = self.embed_tokens if head_is_embedding else ParallelLMHead(
            w if tied else torch.nn.Parameter(torch.randn(10, 4), requires_grad=False))


def _mark(modules):  # what _refresh_cpu_kernels records after rebuilding a handler
    for m in modules:
        m._policyzoo_gemm_key = (m.weight.data_ptr(), m.weight._version)


def test_only_the_head_and_only_when_its_weight_changed():
    m = Model(tied=True)
    first = stale_gemm_modules(m)
    assert first == [m.lm_head]  # the embedding's handler is never called; the emptied linear has none
    _mark(first)
    assert stale_gemm_modules(m) == []  # nothing pushed since: nothing to rebuild
    with torch.no_grad():
        m.embed_tokens.weight.copy_(torch.randn(10, 4))  # the sync's in-place load into the tied weight
    assert stale_gemm_modules(m) == [m.lm_head]
    _mark([m.lm_head])
    with torch.no_grad():  # the same values written again still count as a write (no value compared)
        m.lm_head.weight.copy_(m.lm_head.weight.clone())
    assert stale_gemm_modules(m) == [m.lm_head]


def test_a_replaced_weight_tensor_is_stale_and_a_head_that_is_the_embedding_is_kept():
    m = Model(tied=False)
    _mark(stale_gemm_modules(m))
    m.lm_head.weight = torch.nn.Parameter(torch.randn(10, 4), requires_grad=False)  # new storage, version 0
    assert stale_gemm_modules(m) == [m.lm_head]
    same = Model(tied=True, head_is_embedding=True)  # e.g. a quantized tie returning the embedding itself
    assert stale_gemm_modules(same) == [same.embed_tokens]
