"""The trainer computes only what the loss needs (issue 36, item 3).

* An entropy term's differentiable entropy is computed chunk by chunk with a fused backward
  (``policyzoo.engine.trainer.logprob._TokenLogProbEntropy``): log-probs, entropies and gradients
  equal the textbook differentiable formula (the path used before) on random logits and on the tiny Llama.
* On-policy (one update per batch) the step takes no no-grad scoring forward: the old log-probs
  are the live ones detached, with the same loss and update as when they are scored by a
  separate forward; with several updates per batch the forward is kept.
* One process runs no all-reduce in the step's own collectives.
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch
from _engine_helpers import make_rollout, tiny_model

from policyzoo.engine import dist
from policyzoo.engine.trainer import logprob
from policyzoo.engine.trainer.deepspeed_trainer import Trainer
from policyzoo.engine.trainer.logprob import fused_token_logprobs
from policyzoo.step import train_step
from policyzoo.testing.bandit import Bandit, bandit_run, step_settings

PAD = 2
learn_mod = importlib.import_module("policyzoo.step.learn")  # the module (policyzoo.step.learn is its function)


def textbook_entropy_grad(logits, targets, temperature):
    """The formula the entropy-term path used before (differentiable log-probs and entropy)."""
    z = logits.float() / temperature
    logz = torch.logsumexp(z, -1)
    lp = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logz
    return lp, logz - (torch.softmax(z, -1) * z).sum(-1)


def test_entropy_gradient_of_a_two_token_vocabulary_by_hand():
    # logits [0, ln 3], T = 1: p = [1/4, 3/4]; H = 1/4 ln 4 + 3/4 ln 4/3 = 0.346574 + 0.215762 = 0.562335
    # dH/dz_j = -p_j (ln p_j + H): z0: -1/4 (-1.386294 + 0.562335) = 0.205990, z1: -0.205990
    # d lp(token 1)/dz = onehot - p = [-0.25, 0.25]; so d(lp + H)/dz = [-0.044010, 0.044010]
    x = torch.tensor([[0.0, math.log(3.0)]], requires_grad=True)
    lp, ent = fused_token_logprobs(x, torch.tensor([1]), 1.0, True, entropy_grad=True)
    (lp + ent).sum().backward()
    assert lp.item() == pytest.approx(math.log(0.75), abs=1e-6)
    assert ent.item() == pytest.approx(0.562335, abs=1e-6)
    assert x.grad[0].tolist() == pytest.approx([-0.044010, 0.044010], abs=1e-6)


@pytest.mark.parametrize("chunk_bytes", [1 << 24, 4 * 1000 * 3])  # one chunk; chunks of 3 rows
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_random_logits_entropy_with_grad_match_the_textbook(monkeypatch, chunk_bytes, temperature):
    monkeypatch.setattr(logprob, "CHUNK_BYTES", chunk_bytes)
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(4, 5, 1000, generator=g))
    targets = torch.randint(0, 1000, (4, 5), generator=g)
    w_lp, w_ent = torch.randn(4, 5, generator=g), torch.randn(4, 5, generator=g)
    out = []

    def fused(x, t, temp):
        return fused_token_logprobs(x, t, temp, True, True)

    for fn, dtype in ((textbook_entropy_grad, torch.float64), (textbook_entropy_grad, torch.float32), (fused, None)):
        x = logits.clone().to(dtype or logits.dtype).requires_grad_(True)
        z = x.double() if dtype == torch.float64 else x  # the float64 textbook: the exact values
        lp, ent = fn(z, targets, temperature) if dtype != torch.float64 else _f64(z, targets, temperature)
        ((lp * w_lp).sum() + (ent * w_ent).sum()).backward()
        out.append([y.detach().float() for y in (lp, ent, x.grad)])
    for exact, old, new in zip(*out):
        # the fused path is as close to the exact values as fp32 allows; the old fp32 path's
        # entropy (logZ - sum p z) loses ~1e-5 to cancellation, so old and new agree to that
        assert torch.allclose(new, exact, atol=2e-6, rtol=1e-6), float((new - exact).abs().max())
        assert torch.allclose(new, old, atol=1e-5), float((new - old).abs().max())


def _f64(z, targets, temperature):
    z = z / temperature
    logp = z - torch.logsumexp(z, -1, keepdim=True)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1)


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model()), dtype=torch.float32).eval()


def _reference(model, roll):
    """Each row alone, unpadded, scored with the textbook differentiable formula: [B, T] each."""
    lps, ents = [], []
    t = roll.response_ids.shape[1]
    for i, (p, r) in enumerate(zip(roll.prompt_ids, roll.response_ids.tolist())):
        n = int(roll.response_mask[i].sum())
        logits = model(torch.tensor([p + r[:n]])).logits[0, len(p) - 1:len(p) - 1 + n]
        a, b = textbook_entropy_grad(logits, torch.tensor(r[:n]), roll.temperature)
        lps.append(torch.nn.functional.pad(a, (0, t - n)))
        ents.append(torch.nn.functional.pad(b, (0, t - n)))
    return torch.stack(lps), torch.stack(ents)


ROLL = make_rollout([[1, 40, 41, 42], [1, 40, 41, 42], [1, 50, 51]],
                    [[60, 61, 62, 63, 64], [70, 71], [80, 81, 82]], temperature=0.8)


@pytest.mark.parametrize("share", [False, True], ids=["per-row", "shared-prompt"])
def test_tiny_llama_entropy_term_loss_and_gradients_match_the_old_path(model, share):
    tr = Trainer.__new__(Trainer)  # the scoring paths only, without DeepSpeed
    tr.engine, tr.pad_id, tr.device, tr.share_prompt = model, PAD, torch.device("cpu"), share
    g = torch.Generator().manual_seed(1)
    m = ROLL.response_mask
    w_lp, w_ent = torch.randn(m.shape, generator=g) * m, torch.randn(m.shape, generator=g) * m
    res = []
    for fn in (lambda: _reference(model, ROLL),
               lambda: tr._logprobs(model, ROLL, True, share, cast=False, entropy_grad=True)):
        model.zero_grad()
        lp, ent = fn()
        loss = (lp * w_lp).sum() + (ent * w_ent).sum()  # a loss with an entropy term
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        res.append((lp.detach(), ent.detach(), float(loss.detach()), grads))
    (lp0, ent0, loss0, g0), (lp1, ent1, loss1, g1) = res
    assert torch.allclose(lp1, lp0, atol=1e-5) and torch.allclose(ent1 * m, ent0 * m, atol=1e-5)
    assert loss1 == pytest.approx(loss0, abs=1e-5)
    for name, grad in g0.items():
        assert torch.allclose(g1[name], grad, atol=1e-5), name


# ------------------------------------------------------------------ no forward whose result is known
def _bandit_step(updates: int, score_old: bool = False, monkeypatch=None, algorithm: dict | None = None):
    """One GRPO step on the bandit (SGD: the parameter change is -lr x the gradient); counts the
    no-grad and grad log-prob forwards. ``score_old``: give the step old log-probs from a separate
    no-grad forward, as a trainer that does not skip it would."""
    bandit = Bandit.random(6, 5, right=2, min_len=2, max_len=20, seed=7, optimizer="sgd", lr=0.5)
    with torch.no_grad():
        bandit.theta.copy_(torch.randn(6, 5, generator=torch.Generator().manual_seed(1)))
    calls = {"no_grad": 0, "grad": 0}
    inner = bandit.logprobs

    def counted(rollout, *, grad, **kw):
        calls["grad" if grad else "no_grad"] += 1
        return inner(rollout, grad=grad, **kw)

    bandit.logprobs = counted
    if score_old:
        score = learn_mod._score

        def scored_old(run, policy, rollout, *a):
            batch, scored = score(run, policy, rollout, *a)
            batch.old_logprobs = policy.logprobs(rollout, grad=False)[0]
            return batch, scored
        monkeypatch.setattr(learn_mod, "_score", scored_old)
    run = bandit_run(algorithm or {"base": "grpo", "sample": {"max_tokens": 16}})
    theta0 = bandit.theta.detach().clone()
    m = train_step(run, bandit, lambda: bandit.prompts(24 // run.sample.params.n), seed=3,
                   settings=step_settings(run, updates_per_batch=updates, micro_batches=2))
    return bandit.theta.detach() - theta0, m, calls


def test_on_policy_step_skips_the_old_logprob_forward_with_the_same_loss_and_update(monkeypatch):
    skip_delta, skip_m, skip_calls = _bandit_step(1)
    full_delta, full_m, full_calls = _bandit_step(1, score_old=True, monkeypatch=monkeypatch)
    # one update of 2 micro-batches: 2 forwards with grad either way; the separate no-grad
    # forward (1 with it, 0 skipped) is the only difference in work
    assert skip_calls == {"no_grad": 0, "grad": 2} and full_calls == {"no_grad": 1, "grad": 2}
    assert skip_m["loss"] == pytest.approx(full_m["loss"], abs=1e-7)
    assert torch.allclose(skip_delta, full_delta, atol=1e-7) and skip_delta.abs().max() > 1e-3


def test_several_updates_per_batch_keep_the_old_logprob_forward():
    _, _, calls = _bandit_step(2)
    # 2 updates x 2 micro-batches with grad; the old log-probs of the second update must be those
    # of the weights before the first, so the no-grad forward is taken once
    assert calls == {"no_grad": 1, "grad": 4}


def test_a_kl_in_the_reward_keeps_the_forward_of_the_log_probs_at_sampling_time():
    kl = {"use": "k1", "beta": 0.04, "placement": "reward"}
    _, _, calls = _bandit_step(1, algorithm={"base": "grpo", "sample": {"max_tokens": 16}, "kl": kl})
    # the KL penalty enters the rewards, hence the advantages, before any update: scored once
    # without grad, then 1 update x 2 micro-batches with grad
    assert calls == {"no_grad": 1, "grad": 2}


# ------------------------------------------------------------------ no collective in one process
def test_one_process_runs_no_all_reduce(monkeypatch):
    import torch.distributed as tdist

    calls = []
    monkeypatch.setattr(tdist, "is_available", lambda: True)
    monkeypatch.setattr(tdist, "is_initialized", lambda: True)
    monkeypatch.setattr(tdist, "all_reduce", lambda t, *a, **k: calls.append("all_reduce"))
    monkeypatch.setattr(tdist, "all_gather_object", lambda out, obj: calls.append("gather") or out.__setitem__(
        slice(None), [obj] * len(out)))
    monkeypatch.setattr(dist, "local_device", lambda: torch.device("cpu"))

    def collectives():
        c = dist.DistCollective()
        dist.any_rank(False), dist.sum_ints([3, 2, 1]), c.sum(torch.ones(2)), c.gather(torch.ones(2)), dist.gather(1)

    monkeypatch.setenv("WORLD_SIZE", "1")
    collectives()
    assert calls == []
    monkeypatch.setenv("WORLD_SIZE", "2")  # the same calls on two ranks do communicate (the count can fail)
    collectives()
    assert calls.count("all_reduce") == 3 and calls.count("gather") == 2
