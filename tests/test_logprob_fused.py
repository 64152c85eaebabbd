"""Fused, chunked token log-probs and entropy (policyzoo.engine.trainer.logprob) equal the textbook
``log_softmax(logits / T).gather`` -- values, entropy and gradients to 1e-5 -- on random logits and
on the tiny Llama (per-row and shared-prompt scoring), and a training forward + backward holds
fewer vocabulary-wide tensors at its peak."""

from __future__ import annotations

import math

import pytest
import torch
from _engine_helpers import make_rollout, tiny_model

from policyzoo.engine.trainer import logprob
from policyzoo.engine.trainer.deepspeed_trainer import Trainer
from policyzoo.engine.trainer.logprob import fused_token_logprobs

PAD = 2


def textbook(logits, targets, temperature, entropy):
    """The formula scoring used before the fused path (the reference for 'today's values')."""
    z = logits.float() / temperature
    logz = torch.logsumexp(z, -1)
    lp = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logz
    ent = (logz - (torch.softmax(z, -1) * z).sum(-1)).detach() if entropy else None
    return lp, ent


def test_two_token_vocabulary_by_hand():
    # logits [0, ln 3], T = 1: p = [1/4, 3/4]; lp(token 1) = ln(3/4); H = -(1/4 ln 1/4 + 3/4 ln 3/4)
    # = 0.5623 nats; d lp / d logits = onehot - p = [-1/4, 1/4].
    # T = 0.5: z = [0, 2 ln 3] -> p = [1/10, 9/10]; lp = ln 0.9; grad = (onehot - p) / T = [-0.2, 0.2].
    for t, lp_want, grad_want in ((1.0, math.log(0.75), [-0.25, 0.25]), (0.5, math.log(0.9), [-0.2, 0.2])):
        x = torch.tensor([[0.0, math.log(3.0)]], requires_grad=True)
        lp, ent = fused_token_logprobs(x, torch.tensor([1]), t, True)
        lp.sum().backward()
        assert lp.item() == pytest.approx(lp_want, abs=1e-6)
        assert x.grad[0].tolist() == pytest.approx(grad_want, abs=1e-6)
    x = torch.tensor([[0.0, math.log(3.0)]])
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert fused_token_logprobs(x, torch.tensor([0]), 1.0, True)[1].item() == pytest.approx(h, abs=1e-6)


@pytest.mark.parametrize("chunk_bytes", [logprob.CHUNK_BYTES, 4 * 37 * 2], ids=["one-chunk", "2-row-chunks"])
@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_random_logits_match_the_textbook_formula(monkeypatch, chunk_bytes, temperature, dtype):
    monkeypatch.setattr(logprob, "CHUNK_BYTES", chunk_bytes)  # 2 rows of V = 37 per chunk: 15 rows -> 8 chunks
    g = torch.Generator().manual_seed(0)
    base = (torch.randn(3, 5, 37, generator=g) * 4).to(dtype)
    targets = torch.randint(0, 37, (3, 5), generator=g)
    mask = torch.rand(3, 5, generator=g) > 0.3
    mask[2] = False  # a fully masked row
    w = torch.randn(3, 5, generator=g)
    out = []
    for fn in (textbook, fused_token_logprobs):
        x = base.clone().requires_grad_(True)
        lp, ent = fn(x, targets, temperature, True)
        (torch.where(mask, lp, 0.0) * w).sum().backward()  # as the trainer masks
        out.append((lp, ent, x.grad))
    (lp0, ent0, g0), (lp1, ent1, g1) = out
    assert g1.dtype == dtype and ent1.requires_grad is False
    # entropy against the formula in float64: the fp32 textbook's logz - sum p z loses ~1e-5 to
    # cancellation on near-certain rows (logz ~ 20), the fused -sum p log p does not
    z64 = base.double() / temperature
    ent64 = -(z64.log_softmax(-1).exp() * z64.log_softmax(-1)).sum(-1).float()
    assert torch.allclose(lp1, lp0, atol=1e-5) and torch.allclose(ent1, ent64, atol=1e-5)
    assert torch.allclose(g1.float(), g0.float(), atol=1e-5 if dtype == torch.float32 else 1e-2)
    assert torch.all(g1[2] == 0)  # the masked row gets exactly no gradient


def test_sum_pi_squared_by_hand_across_chunks(monkeypatch):
    # logits [0, ln 3]: p = [1/4, 3/4] -> 1/16 + 9/16 = 0.625; at T = 0.5: p = [1/10, 9/10] -> 0.82.
    # Uniform logits over 4 tokens: 4 x (1/4)^2 = 0.25. 1-row chunks (CHUNK_BYTES = 4 x V) mix them.
    monkeypatch.setattr(logprob, "CHUNK_BYTES", 4 * 4)
    x = torch.tensor([[[0.0, math.log(3.0), -1e9, -1e9], [1.0, 1.0, 1.0, 1.0]]])
    assert logprob.sum_pi_squared(x, 1.0)[0].tolist() == pytest.approx([0.625, 0.25], abs=1e-6)
    assert logprob.sum_pi_squared(x, 0.5)[0].tolist() == pytest.approx([0.82, 0.25], abs=1e-6)


def test_bad_shapes_and_temperature_are_refused():
    with pytest.raises(ValueError, match="do not match targets"):
        fused_token_logprobs(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long), 1.0, False)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        fused_token_logprobs(torch.zeros(2, 5), torch.zeros(2, dtype=torch.long), 0.0, False)


# ------------------------------------------------------------------ the tiny Llama, both scoring paths
P1, P2 = [1, 40, 41, 42, 43], [1, 50, 51]
ROLL = make_rollout([P1, P2, P1, P2, P1, P2], [list(range(60, 72)), [70, PAD], [64], [71, 72, 73, 74],
                                               [65, 66, PAD], [75, 76, 77]], 0.7, PAD)


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model()), dtype=torch.float32).eval()


def _reference(model, roll):
    """Each row alone, unpadded, scored with the textbook formula: log-probs and entropy [B, T]."""
    lp = torch.zeros(roll.response_ids.shape)
    ent = torch.zeros(roll.response_ids.shape)
    for i, (p, r) in enumerate(zip(roll.prompt_ids, roll.response_ids.tolist())):
        n = int(roll.response_mask[i].sum())
        logits = model(torch.tensor([p + r[:n]])).logits[0, len(p) - 1:len(p) - 1 + n]
        a, b = textbook(logits, torch.tensor(r[:n]), roll.temperature, True)
        lp[i, :n], ent[i, :n] = a, b
    return lp, ent


@pytest.mark.parametrize("share", [False, True], ids=["per-row", "shared-prompt"])
def test_tiny_llama_logprobs_entropy_and_gradients_match_the_textbook(model, share):
    tr = Trainer.__new__(Trainer)  # the scoring paths only, without DeepSpeed
    tr.engine, tr.pad_id, tr.device, tr.share_prompt = model, PAD, torch.device("cpu"), share
    w = torch.randn(ROLL.response_ids.shape, generator=torch.Generator().manual_seed(1)) * ROLL.response_mask
    grads = []
    for fn in (lambda: _reference(model, ROLL), lambda: tr._logprobs(model, ROLL, True, share, cast=False)):
        model.zero_grad()
        lp, ent = fn()
        (lp * w).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        if len(grads) == 1:
            want_lp, want_ent = lp.detach(), ent
    m = ROLL.response_mask
    assert torch.allclose(lp.detach(), want_lp, atol=1e-5) and torch.allclose(ent, want_ent, atol=1e-5)
    assert torch.all(lp[~m] == 0) and torch.all(ent[~m] == 0)
    for name, g in grads[0].items():
        assert torch.allclose(grads[1][name], g, atol=1e-5), name


# ------------------------------------------------------------------ peak memory of forward + backward
def _vocab_wide_peak(fn, unit: int) -> tuple[int, int]:
    """Run ``fn`` under torch.profiler (profile_memory): the peak of allocated bytes over the run
    (relative to its start) and the most ``unit``-byte tensors alive at once. CPU allocations are
    reported by the allocator itself, so the counts do not depend on the machine's load."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = wide = most_wide = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
        wide += (nbytes == unit) - (nbytes == -unit)
        most_wide = max(most_wide, wide)
    return peak, most_wide


def test_training_step_holds_fewer_vocabulary_wide_tensors(monkeypatch):
    # A head h [N, H] @ W [H, V] -> logits [N, V] (N = 256 rows, V = 8192: 8 MiB fp32 = one
    # "unit"), T = 0.7, entropy on, loss = sum(lp * w), backward into W.
    # Textbook, alive at once in forward: the logits, z = logits / T (kept by logsumexp for its
    # backward), softmax(z) and softmax * z for the entropy -> >= 4 units. Fused: the logits only
    # (kept by the graph), chunks of 1 MiB -> 1 unit; in backward the logits and the one gradient
    # tensor -> 2 units. So the fused peak holds >= 2 fewer units, and its byte peak is lower by
    # at least 2 units too (the chunks and the [H, V] weight gradient, 2 MiB, are the same in both
    # or smaller than a unit).
    monkeypatch.setattr(logprob, "CHUNK_BYTES", 1 << 20)
    g = torch.Generator().manual_seed(0)
    n, h, v = 256, 64, 8192
    unit = n * v * 4
    hidden, targets, w = torch.randn(n, h, generator=g), torch.randint(0, v, (n,), generator=g), torch.randn(n)
    weight = (torch.randn(h, v, generator=g) * 0.1).requires_grad_(True)

    def step(fn):
        def run():
            lp, ent = fn(hidden @ weight, targets, 0.7, True)
            (lp * w).sum().backward()
        return run

    old_peak, old_wide = _vocab_wide_peak(step(textbook), unit)
    new_peak, new_wide = _vocab_wide_peak(step(fused_token_logprobs), unit)
    assert old_wide >= 4 and new_wide <= 2, (old_wide, new_wide)
    assert new_peak <= old_peak - 2 * unit, (old_peak / unit, new_peak / unit)


def test_trainer_sum_pi_squared_matches_the_full_softmax(model):
    tr = Trainer.__new__(Trainer)
    tr.engine, tr.pad_id, tr.device, tr.score_rows, tr.score_tokens = model, PAD, torch.device("cpu"), 16, None
    from policyzoo.engine.trainer.modeling import pack

    with torch.no_grad():
        ids, attn, pos, t = pack(ROLL, PAD, "cpu")
        p = torch.softmax(model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, -t - 1:-1] / 0.7, -1)
        want = torch.where(ROLL.response_mask, (p * p).sum(-1), 0.0)
    assert torch.allclose(tr.sum_pi_squared(ROLL), want, atol=1e-6)
