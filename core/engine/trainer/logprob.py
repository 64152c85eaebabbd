"""Token log-probs and entropy from logits in chunks of rows, with a fused backward.

The textbook ``(logits / T).log_softmax(-1).gather(-1, targets)`` builds several tensors as large
as the logits ``[B, T, V]`` (V the vocabulary: ``[8, 128, 49152]`` fp32 is 201 MB): the divided
copy (a pure copy at T = 1), ``logsumexp``'s shifted input, a softmax and a product for the
entropy, and in backward a zero-filled gather gradient, the softmax gradient and their sum. Fresh
allocations that large pay first-touch page faults on every step. Here the rows go through in
chunks of at most :data:`CHUNK_BYTES` of fp32 logits: each chunk is scaled, reduced and (for the
entropy) exponentiated while it is hot in cache, and only ``[B, T]`` results leave the loop.

Backward (:class:`_TokenLogProb`): with ``z = logits / T``, ``lp = z[target] - logsumexp(z)``,
so ``d lp / d logits = (onehot(target) - softmax(z)) / T``. It is written chunk by chunk into the
one gradient tensor autograd needs anyway, from the logits (kept alive by the graph anyway) and
the saved ``logsumexp [N]``: one vocabulary-wide tensor instead of three.

Values equal the textbook formula's up to float summation order (<= 1e-5 nats and 1e-5 in every
gradient on the test models and random logits, ``tests/test_logprob_fused.py``). The entropy
``H = -sum_v p_v log p_v`` (nats, ``p = softmax(z)``) is computed only when asked and costs one
chunk-sized exponential more. It carries no gradient, except for a loss term that ``needs_entropy``
(:class:`_TokenLogProbEntropy`): then ``d H / d z_v = -p_v (log p_v + H)`` is added chunk by chunk
into the same one gradient tensor, so an entropy bonus builds no vocabulary-wide fp32 tensor either.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

#: fp32 bytes of logits per chunk. 16 MB stays under glibc's largest mmap threshold (32 MB), so a
#: freed chunk's memory is reused from the heap by the next chunk instead of being mapped afresh
#: (and page-faulted in) each time; 85 rows of a 49152-token vocabulary.
CHUNK_BYTES = 1 << 24
#: the same on an accelerator (256 MB): no mmap threshold there, and a GPU kernel over 27 rows (16 MB at
#: Qwen's 152,064-token vocabulary) is launch-bound; 441 rows at that vocabulary, 1,365 at 49,152
ACCELERATOR_CHUNK_BYTES = 1 << 28


def _chunks(n: int, vocab: int, device: torch.device | None = None):
    """Row ranges ``[lo, hi)`` of ``n`` rows holding at most :data:`CHUNK_BYTES` of fp32 logits each
    (:data:`ACCELERATOR_CHUNK_BYTES` on a device other than the CPU), at least one row."""
    budget = CHUNK_BYTES if device is None or device.type in ("cpu", "meta") else ACCELERATOR_CHUNK_BYTES
    rows = max(1, budget // (4 * max(vocab, 1)))
    return ((lo, min(lo + rows, n)) for lo in range(0, n, rows))


def _scaled(x: torch.Tensor, temperature: float) -> torch.Tensor:
    """A chunk of logits as fp32 divided by ``temperature`` (no copy for fp32 at 1.0)."""
    x = x.float()
    return x if temperature == 1.0 else x / temperature


class _TokenLogProb(torch.autograd.Function):
    """``flat [N, V]``, ``targets [N]`` -> log-probs ``[N]``, logsumexp ``[N]`` (no grad) and, with
    ``entropy``, the entropies ``[N]`` (no grad; else an empty tensor), taken from the same chunk
    as the logsumexp while it is at hand; the backward of the log-probs only (see the module docstring)."""

    @staticmethod
    def forward(ctx, flat, targets, temperature, entropy):
        n, v = flat.shape
        lp = torch.empty(n, dtype=torch.float32, device=flat.device)
        logz = torch.empty(n, dtype=torch.float32, device=flat.device)
        ent = torch.empty(n if entropy else 0, dtype=torch.float32, device=flat.device)
        for lo, hi in _chunks(n, v, flat.device):
            z = _scaled(flat[lo:hi], temperature)
            logz[lo:hi] = torch.logsumexp(z, -1)
            lp[lo:hi] = z.gather(-1, targets[lo:hi, None]).squeeze(-1) - logz[lo:hi]
            if entropy:  # H = -sum_v p_v log p_v with log p = z - logZ (no cancellation)
                logp = z - logz[lo:hi, None]
                ent[lo:hi] = -logp.exp().mul_(logp).sum(-1)
        ctx.save_for_backward(flat, targets, logz)
        ctx.temperature = temperature
        ctx.mark_non_differentiable(logz, ent)
        return lp, logz, ent

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_lp, _grad_logz, _grad_ent):
        flat, targets, logz = ctx.saved_tensors
        t = ctx.temperature
        n, v = flat.shape
        grad = torch.empty_like(flat)
        for lo, hi in _chunks(n, v, flat.device):
            g = grad_lp[lo:hi, None].float()
            # (onehot - softmax(z)) * g / T, softmax from the saved logsumexp; fp32 logits: written
            # straight into the gradient's rows (no chunk copy), else computed in fp32 and cast
            d = grad[lo:hi] if flat.dtype == torch.float32 else None
            d = torch.sub(_scaled(flat[lo:hi], t), logz[lo:hi, None], out=d).exp_().mul_(-g)
            d.scatter_add_(-1, targets[lo:hi, None], g)
            if t != 1.0:
                d.div_(t)
            if flat.dtype != torch.float32:
                grad[lo:hi] = d
        return grad, None, None, None


class _TokenLogProbEntropy(torch.autograd.Function):
    """``flat [N, V]``, ``targets [N]`` -> log-probs ``[N]`` and entropies ``[N]`` (nats), both
    differentiable w.r.t. ``flat``: with ``z = flat / T``, ``p = softmax(z)``,
    ``d lp / d z = onehot(target) - p`` and ``d H / d z = -p (log p + H)``, so the gradient is
    ``(p * (-g_lp - g_H (log p + H)) + onehot(target) g_lp) / T``, written chunk by chunk."""

    @staticmethod
    def forward(ctx, flat, targets, temperature):
        n, v = flat.shape
        lp = torch.empty(n, dtype=torch.float32, device=flat.device)
        logz = torch.empty(n, dtype=torch.float32, device=flat.device)
        ent = torch.empty(n, dtype=torch.float32, device=flat.device)
        for lo, hi in _chunks(n, v, flat.device):
            z = _scaled(flat[lo:hi], temperature)
            logz[lo:hi] = torch.logsumexp(z, -1)
            lp[lo:hi] = z.gather(-1, targets[lo:hi, None]).squeeze(-1) - logz[lo:hi]
            logp = z - logz[lo:hi, None]
            ent[lo:hi] = -(logp.exp() * logp).sum(-1)
        ctx.save_for_backward(flat, targets, logz, ent)
        ctx.temperature = temperature
        return lp, ent

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_lp, grad_ent):
        flat, targets, logz, ent = ctx.saved_tensors
        t = ctx.temperature
        n, v = flat.shape
        grad = torch.empty_like(flat)
        for lo, hi in _chunks(n, v, flat.device):
            g, gh = grad_lp[lo:hi, None].float(), grad_ent[lo:hi, None].float()
            logp = _scaled(flat[lo:hi], t) - logz[lo:hi, None]
            p = logp.exp()
            d = logp.add_(ent[lo:hi, None]).mul_(-gh).sub_(g).mul_(p)  # p (-g - gh (log p + H))
            d.scatter_add_(-1, targets[lo:hi, None], g)
            grad[lo:hi] = d if t == 1.0 else d.div_(t)
        return grad, None, None


def fused_token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float,
                         entropy: bool, entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``logits [..., V]`` (any float dtype) at the positions before ``targets [...]`` (long, each
    in ``[0, V)``) -> log-probs ``[...]`` (fp32, differentiable w.r.t. ``logits``) of the targets
    under softmax(logits / temperature), and the entropy ``[...]`` (fp32 nats; no grad unless
    ``entropy_grad``) when ``entropy`` else None. Logits that cannot be viewed as ``[N, V]`` are
    copied once (pass contiguous ones). Raises ValueError when the leading shapes differ or
    ``temperature <= 0``."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"token_logprobs: logits {tuple(logits.shape)} do not match targets {tuple(targets.shape)}"
                         " (expected logits [..., V] with targets [...])")
    if not temperature > 0:
        raise ValueError(f"token_logprobs: temperature must be > 0, got {temperature}")
    shape, v = targets.shape, logits.shape[-1]
    flat = logits.reshape(-1, v)
    if entropy and entropy_grad:
        lp, ent = _TokenLogProbEntropy.apply(flat, targets.reshape(-1), float(temperature))
        return lp.view(shape), ent.view(shape)
    lp, _, ent = _TokenLogProb.apply(flat, targets.reshape(-1), float(temperature), bool(entropy))
    return lp.view(shape), (ent.view(shape) if entropy else None)


@torch.no_grad()
def sum_pi_squared(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits [..., V]`` -> ``sum_v softmax(logits / temperature)_v^2 [...]`` (fp32, no grad),
    chunk by chunk like :func:`fused_token_logprobs`."""
    v = logits.shape[-1]
    flat = logits.reshape(-1, v)
    out = torch.empty(flat.shape[0], dtype=torch.float32, device=flat.device)
    for lo, hi in _chunks(*flat.shape, flat.device):
        p = torch.softmax(_scaled(flat[lo:hi], temperature), -1)
        out[lo:hi] = (p * p).sum(-1)
    return out.view(logits.shape[:-1])
