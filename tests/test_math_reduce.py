"""Reduces: length weighting by hand, and exactness under micro-batching and padding."""

import warnings

import pytest
import torch

import policyzoo
from policyzoo.contract import Rollout, StepBatch, StepTotals
from policyzoo.errors import ConfigError
from policyzoo.plugins.reduce import SeqMeanTokenMean, SeqMeanTokenSum, TokenMean, TokenSum, TokenSumNorm
from policyzoo.step import micro_loss, step_totals

REDUCES = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "token_sum_norm", "token_sum"]


def lengths_mask(lengths, width):
    return torch.arange(width).expand(len(lengths), width) < torch.tensor(lengths).unsqueeze(-1)


def test_length_bias_per_token_weights():
    # Two wrong answers, A = -1, lengths 4 and 18, on-policy loss -A x ratio = ratio per token.
    # The gradient of the reduced loss w.r.t. one token's loss is that token's weight:
    #   seq_mean_token_mean: 1 / (N x |y_i|) = 1/(2 x 4) = 0.125 vs 1/(2 x 18) = 0.027778 -> 4.5x
    #   token_mean:          1 / (4 + 18) = 1/22 for both
    #   token_sum_norm (C = 32): 1 / (2 x 32) = 1/64 for both
    #   token_sum: 1 for both (no normaliser)
    mask = lengths_mask([4, 18], 20)
    totals = StepTotals(tokens=22, sequences=2)
    weights = {}
    for comp in (SeqMeanTokenMean(), TokenMean(), TokenSumNorm(constant=32), TokenSum()):
        loss = torch.ones(2, 20, requires_grad=True)
        comp.reduce(loss=loss, response_mask=mask, totals=totals).backward()
        weights[comp.name] = (loss.grad[0, 0].item(), loss.grad[1, 0].item())
        assert loss.grad[~mask].abs().sum() == 0
    short, long = weights["seq_mean_token_mean"]
    assert short == pytest.approx(0.125) and long == pytest.approx(1 / 36)
    assert short / long == pytest.approx(4.5)
    assert weights["token_mean"] == pytest.approx((1 / 22, 1 / 22))
    assert weights["token_sum_norm"] == pytest.approx((1 / 64, 1 / 64))
    assert weights["token_sum"] == (1.0, 1.0)


def test_reduce_values_by_hand():
    # rows: [1, 2, 3] (3 tokens) and [4, (pad 100)] (1 token); N = 2 sequences, 4 tokens
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    totals = StepTotals(tokens=4, sequences=2)
    kw = dict(loss=loss, response_mask=mask, totals=totals)
    assert TokenMean().reduce(**kw).item() == pytest.approx(10 / 4)               # (1+2+3+4)/4
    assert SeqMeanTokenMean().reduce(**kw).item() == pytest.approx((2 + 4) / 2)   # (6/3 + 4/1)/2
    assert SeqMeanTokenSum().reduce(**kw).item() == pytest.approx((6 + 4) / 2)    # (6 + 4)/2
    assert TokenSumNorm(constant=5).reduce(**kw).item() == pytest.approx(10 / (5 * 2))
    assert TokenSum().reduce(**kw).item() == 10.0                                   # 1+2+3+4, padding ignored


def test_zero_totals_give_zero_not_nan():
    loss = torch.ones(1, 2, requires_grad=True)
    mask = torch.zeros(1, 2, dtype=torch.bool)
    for comp in (TokenMean(), SeqMeanTokenMean(), SeqMeanTokenSum(), TokenSumNorm(constant=4), TokenSum()):
        out = comp.reduce(loss=loss, response_mask=mask, totals=StepTotals(0, 0))
        assert out.item() == 0.0
        out.backward()
        assert torch.equal(loss.grad, torch.zeros(1, 2))


def make_batch(width, seed=0):
    """B = 6 ragged rows (lengths 5, 3, 1, 4, 0, 2), padded to ``width`` with garbage."""
    g = torch.Generator().manual_seed(seed)
    lengths = [5, 3, 1, 4, 0, 2]
    b = len(lengths)
    mask = lengths_mask(lengths, width)
    base = torch.randn(b, 5, generator=g) - 2.0
    garbage = torch.full((b, width - 5), 123.0)
    logprobs = torch.cat([base, garbage], 1)
    old = torch.cat([base + 0.3 * torch.randn(b, 5, generator=g), -garbage], 1)
    adv = torch.cat([torch.randn(b, 1, generator=g).expand(b, 5), garbage], 1)
    rollout = Rollout(prompt_ids=[[1]] * b, response_ids=torch.zeros(b, width, dtype=torch.long), response_mask=mask,
                      rollout_logprobs=old.clone(), group_ids=torch.tensor([7, 3, 7, 3, 7, 3]),
                      truncated=torch.zeros(b, dtype=torch.bool), rows=[{"i": i} for i in range(b)], max_tokens=16)
    return StepBatch(rollout, rewards=torch.zeros(b), old_logprobs=old, advantages=adv), logprobs


def run_with(reduce, clip="ppo_clip"):
    return policyzoo.assemble({"base": "grpo", "kl": None, "reduce": {"use": reduce}, "clip": {"use": clip},
                               "sample": {"max_tokens": 16}})


def loss_and_grad(run, batch, logprobs, n_micro, width=5):
    theta = logprobs.clone().requires_grad_(True)
    totals = step_totals(batch)
    total = 0.0
    for mb in batch.split(n_micro):
        idx = torch.tensor([r["i"] for r in mb.rollout.rows], dtype=torch.long)
        loss, _ = micro_loss(run, mb, theta[idx], totals)
        loss.backward()
        total += loss.item()
    return total, theta.grad[:, :width]


@pytest.mark.parametrize("clip", ["ppo_clip", "cispo", "none", "dppo_tv", "dppo_kl", "gmpo", "vespo"])
@pytest.mark.parametrize("reduce", REDUCES)
def test_micro_batches_and_padding_give_same_loss_and_grad(reduce, clip):
    run = run_with(reduce, clip)
    batch, logprobs = make_batch(5)
    full, grad = loss_and_grad(run, batch, logprobs, 1)
    assert grad.abs().sum() > 0
    for k in (2, 3, 6):
        loss_k, grad_k = loss_and_grad(run, batch, logprobs, k)
        assert loss_k == pytest.approx(full, rel=1e-6, abs=1e-7)
        assert torch.allclose(grad_k, grad, atol=1e-7)
    padded, lp_padded = make_batch(12)
    for k in (1, 4):
        loss_p, grad_p = loss_and_grad(run, padded, lp_padded, k)
        assert loss_p == pytest.approx(full, rel=1e-6, abs=1e-7)
        assert torch.allclose(grad_p, grad, atol=1e-7)


def test_token_sum_norm_uses_configured_constant_not_padded_width():
    # the run's sample.max_tokens (16) becomes C; widths 5 and 12 give the same loss
    run = run_with("token_sum_norm")
    assert run.reduce.constant == 16.0
    assert policyzoo.assemble("dr_grpo").reduce.constant == 256.0  # dr_grpo's sample.max_tokens
    assert policyzoo.assemble({"base": "dr_grpo", "reduce": {"constant": 100}}).reduce.constant == 100.0
    # a single row of 3 tokens with loss 1 each: 3 / (16 x 1)
    out = run.reduce.reduce(loss=torch.ones(1, 40), response_mask=lengths_mask([3], 40), totals=StepTotals(3, 1))
    assert out.item() == pytest.approx(3 / 16)


@pytest.mark.parametrize("reduce", ["token_sum_norm", "token_sum"])
def test_sequence_ratio_with_token_sum_reduce_warns(reduce):
    # allowed (token_mean weighs rows by length the same way and always was), with the reason
    with pytest.warns(UserWarning) as w:
        run = policyzoo.assemble({"base": "gspo", "reduce": {"use": reduce}})
    msg = str(w[0].message)
    assert run.reduce.name == reduce
    assert "sequence-level ratio" in msg and "|y_i|" in msg and "seq_mean_token_mean" in msg and "luspo" in msg


def test_sequence_ratio_with_seq_mean_token_sum_is_luspo_and_silent():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert policyzoo.assemble({"base": "gspo", "reduce": {"use": "seq_mean_token_sum"}}).reduce.name == \
            "seq_mean_token_sum"


def test_sequence_ratio_with_averaging_reduce_accepted():
    for reduce in ("seq_mean_token_mean", "token_mean"):
        assert policyzoo.assemble({"base": "gspo", "reduce": {"use": reduce}}).reduce.name == reduce
    # and the token ratio with a token-sum reduce is fine (Dr. GRPO)
    assert policyzoo.assemble({"base": "grpo", "reduce": {"use": "token_sum_norm"}}).reduce.constant == 256.0


def test_token_sum_norm_param_validation():
    with pytest.raises(ConfigError):
        TokenSumNorm(constant=0)
