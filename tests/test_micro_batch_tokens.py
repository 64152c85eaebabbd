"""Token-budget micro-batches (``train.max_tokens_per_micro_batch``): the split, its exactness on
the bandit's full step, and on a real transformer: log-probs and gradients of the micro-batched
loss equal those of every row's own unpadded forward to 1e-5."""

from __future__ import annotations

import pytest
import torch
from _engine_helpers import make_rollout, tiny_model

from policyzoo.contract import StepBatch, token_budget_bounds
from policyzoo.engine.trainer.prefix import shared_prompt_logprobs
from policyzoo.errors import ConfigError
from policyzoo.run_config import load_config
from policyzoo.step import train_step
from policyzoo.testing.bandit import Bandit, bandit_run, step_settings

PAD = 2


def test_bounds_by_hand():
    # costs 5 3 4 9 2 under 8: [5 3] = 8 fits, +4 would be 12 -> [4], +9 -> 13 -> [9] alone
    # (over the budget, never cut), [2]
    assert token_budget_bounds([5, 3, 4, 9, 2], 8) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    assert token_budget_bounds([1, 1, 1], 100) == [(0, 3)]
    assert token_budget_bounds([], 8) == []


def test_split_counts_prompt_and_real_response_tokens():
    # rows: prompt 5 + 4 real, prompt 3 + 1 real (+ padding, not counted), prompt 5 + 2 real -> 9, 4, 7
    roll = make_rollout([[1, 4, 5, 6, 7], [1, 8, 9], [1, 4, 5, 6, 7]], [[10, 11, 12, 13], [14], [15, 16]])
    batch = StepBatch(roll, torch.zeros(3))
    assert [len(mb) for mb in batch.split_tokens(13)] == [2, 1]  # 9 + 4 = 13 fits, + 7 does not
    assert [len(mb) for mb in batch.split_tokens(8)] == [1, 1, 1]
    parts = batch.split_tokens(11)  # [9], [4 + 7]
    assert [mb.rollout.prompt_ids for mb in parts] == [[[1, 4, 5, 6, 7]], [[1, 8, 9], [1, 4, 5, 6, 7]]]


def test_both_micro_batch_keys_is_a_config_error():
    with pytest.raises(ConfigError, match="set only one"):
        load_config(None, "grpo", ["train.micro_batches=2", "train.max_tokens_per_micro_batch=512"])
    assert load_config(None, "grpo", ["train.max_tokens_per_micro_batch=512"]).train.max_tokens_per_micro_batch == 512


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("name", ["grpo", "ppo", "dapo"])
def test_token_budget_gives_the_same_update_on_the_bandit(name, catalog):
    # SGD: the parameter change is -lr x the accumulated gradient, so equal changes = equal gradients
    def one(**settings):
        bandit = Bandit.random(6, 5, right=2, min_len=2, max_len=20, seed=7, optimizer="sgd", lr=0.5, critic_lr=0.5)
        with torch.no_grad():
            bandit.theta.copy_(torch.randn(6, 5, generator=torch.Generator().manual_seed(1)))
        calls = []
        inner = bandit.backward
        bandit.backward = lambda *a: (calls.append(1), inner(*a))[1]
        run = bandit_run({"base": name, "sample": {"max_tokens": 16}}, catalog)
        theta0 = bandit.theta.detach().clone()
        m = train_step(run, bandit, lambda: bandit.prompts(24 // run.sample.params.n), seed=3,
                       settings=step_settings(run, **settings))
        return bandit.theta.detach() - theta0, m, len(calls)

    d1, m1, n1 = one()
    d2, m2, n2 = one(max_tokens_per_micro_batch=40)
    # 24 rows of 1 prompt token + 2..16 response tokens (> 72 tokens in all) under 40 per micro-batch
    assert n1 == 1 and n2 >= 2
    assert float(d1.abs().max()) > 1e-3
    assert torch.allclose(d1, d2, rtol=1e-5, atol=1e-6)
    assert m1["loss"] == pytest.approx(m2["loss"], rel=1e-5, abs=1e-7)


class _TwoRanks:
    """The collective of rank 0 of 2, whose other rank needs 6 micro-batches (sums: this rank only)."""

    world_size, rank = 2, 0

    def sum(self, x):
        return x

    def gather(self, x):
        return torch.cat([x, torch.full_like(x, 6)])


@pytest.mark.usefixtures("one_thread")
def test_every_rank_runs_as_many_micro_batches_as_the_rank_that_needs_most(catalog):
    def one(budget, collective=None):
        bandit = Bandit.random(6, 5, right=2, min_len=2, max_len=20, seed=7, optimizer="sgd", lr=0.5)
        if collective is not None:
            bandit.collective = collective
        calls = []
        inner = bandit.backward
        bandit.backward = lambda *a: (calls.append(1), inner(*a))[1]
        run = bandit_run({"base": "grpo", "sample": {"max_tokens": 16}}, catalog)
        theta0 = bandit.theta.detach().clone()
        train_step(run, bandit, lambda: bandit.prompts(3), seed=3,
                   settings=step_settings(run, max_tokens_per_micro_batch=budget))
        return bandit.theta.detach() - theta0, len(calls)

    d1, n1 = one(1000)  # 24 rows of at most 17 tokens fit one micro-batch
    d2, n2 = one(1000, _TwoRanks())  # the other rank needs 6: this one splits its rows 6 ways too
    assert (n1, n2) == (1, 6)
    assert torch.allclose(d1, d2, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(str(tiny_model()), dtype=torch.float32).eval()


def test_micro_batched_logprobs_and_gradients_equal_the_per_row_forward(model):
    p1, p2 = [1, 40, 41, 42, 43], [1, 50, 51]
    roll = make_rollout([p1, p1, p2, p2, p1, p2],
                        [list(range(60, 72)), [61, 62], [70], [71, 72, 73, 74], [63, 64, 65], [75, 76]], 0.7, PAD)
    batch = StepBatch(roll, torch.zeros(6))
    # costs 17 7 4 7 8 5: under 12 -> [17] [7 4] [7] [8] [5]: 5 micro-batches, prompts split across them
    micro = batch.split_tokens(12)
    assert [len(mb) for mb in micro] == [1, 2, 1, 1, 1]
    w = torch.randn(roll.response_ids.shape, generator=torch.Generator().manual_seed(1)) * roll.response_mask
    tokens = int(roll.response_mask.sum())  # the whole step's normaliser, as StepTotals gives every micro-batch

    # reference: each row alone, unpadded, prompt + response; token k read at position len(prompt) - 1 + k
    model.zero_grad()
    want = torch.zeros(roll.response_ids.shape)
    for i, (p, r) in enumerate(zip(roll.prompt_ids, roll.response_ids.tolist())):
        n = int(roll.response_mask[i].sum())
        lp = (model(torch.tensor([p + r[:n]])).logits[0] / 0.7).log_softmax(-1)
        row = torch.stack([lp[len(p) - 1 + k, tok] for k, tok in enumerate(r[:n])])
        (row * w[i, :n]).sum().div(tokens).backward()
        want[i, :n] = row.detach()
    ref = {n: p.grad.clone() for n, p in model.named_parameters()}

    model.zero_grad()
    got, lo = torch.zeros(roll.response_ids.shape), 0
    for mb in micro:
        lp = shared_prompt_logprobs(model, mb.rollout, PAD, "cpu", False)[0]
        t = lp.shape[1]
        (lp * w[lo:lo + len(mb), :t]).sum().div(tokens).backward()
        got[lo:lo + len(mb), :t] = lp.detach()
        lo += len(mb)
    assert torch.allclose(got, want, atol=1e-5)
    scale = max(float(g.abs().max()) for g in ref.values())
    assert scale > 0
    for n, p in model.named_parameters():
        assert torch.allclose(p.grad, ref[n], atol=1e-5 * scale), n
    model.zero_grad()


class _Counting(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner, self.rows = inner, []

    def forward(self, **kw):
        if kw.get("past_key_values") is None:  # a prompt forward: one per chunk
            self.rows.append(kw["input_ids"].shape[0])
        return self.inner(**kw)


def test_no_grad_scoring_chunks_follow_the_token_budget(model):
    from policyzoo.engine.trainer.deepspeed_trainer import Trainer

    roll = make_rollout([[1, 40, 41, 42, 43], [1, 40, 41, 42, 43], [1, 50, 51], [1, 50, 51]],
                        [list(range(60, 72)), [61, 62], [70], [71, 72, 73, 74]], 0.7, PAD)
    tr = Trainer.__new__(Trainer)  # the scoring paths only, without DeepSpeed
    tr.engine, tr.pad_id, tr.device, tr.share_prompt = _Counting(model), PAD, torch.device("cpu"), True
    tr.score_rows = 16
    whole = tr.logprobs(roll, grad=False)[0]
    assert tr.engine.rows == [2]  # one chunk of 4 rows, 2 distinct prompts
    tr.engine.rows, tr.score_tokens = [], 12
    # costs 17, 7, 4, 7 under 12: [17] [7 4] [7] -> 3 chunks with 1, 2 (two prompts) and 1 distinct prompts
    chunked = tr.logprobs(roll, grad=False)[0]
    assert tr.engine.rows == [1, 2, 1]
    assert torch.allclose(chunked, whole, atol=1e-6)
