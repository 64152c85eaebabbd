"""On-policy distillation: the ``distill`` term by hand, the ``distill`` bundle through the step, and
the teacher's checks before any model loads (``model.teacher``)."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from _engine_helpers import tiny_model

import policyzoo
from policyzoo.contract import Rollout, StepBatch
from policyzoo.engine.run.checks import check_teacher
from policyzoo.engine.run.preload import preload
from policyzoo.errors import ComponentError, ConfigError
from policyzoo.plugins.term import Distill
from policyzoo.run_config import load_config
from policyzoo.step import micro_loss, needs_reference, prepare, step_totals
from policyzoo.testing.tiny import build_tiny_model

LP = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -3.0, -1.0]], dtype=torch.float64)
TEACHER = torch.tensor([[-1.5, -1.0, -0.5], [-0.2, -2.0, -4.0]], dtype=torch.float64)
MASK = torch.tensor([[True, True, False], [True, True, True]])


def test_term_value_and_gradient_by_hand():
    # k1 = lp - teacher: row 0 [0.5, -1.0, (masked)], row 1 [0.0, -1.0, 3.0]. On-policy the ratio
    # exp(lp - sg(lp)) is 1 with d ratio / d lp = 1, so the term is k1 and its gradient k1.
    lp = LP.clone().requires_grad_(True)
    ratio = torch.exp(lp - lp.detach())
    out = Distill().term(logprobs=lp, ref_logprobs=TEACHER, ratio=ratio, response_mask=MASK)
    expect = torch.tensor([[0.5, -1.0, 0.0], [0.0, -1.0, 3.0]], dtype=torch.float64)
    assert torch.equal(out.detach(), expect)
    out.sum().backward()
    assert torch.equal(lp.grad, expect)
    # off-policy: old = lp - 0.1 everywhere, r = e^0.1 = 1.1051709181; the value is k1 r and the
    # gradient k1 x d r / d lp = k1 r (k1 itself is a constant: no gradient through the teacher gap)
    lp2 = LP.clone().requires_grad_(True)
    r = torch.exp(lp2 - (LP - 0.1))
    out2 = Distill().term(logprobs=lp2, ref_logprobs=TEACHER, ratio=r, response_mask=MASK)
    out2.sum().backward()
    assert torch.allclose(out2.detach(), expect * 1.1051709181, atol=1e-10)
    assert torch.allclose(lp2.grad, expect * 1.1051709181, atol=1e-10)


def test_term_without_teacher_log_probs_names_the_fix():
    with pytest.raises(ValueError, match="model.teacher"):
        Distill().term(logprobs=LP, ref_logprobs=None, ratio=torch.ones_like(LP), response_mask=MASK)


def _batch(rewards, ref):
    b, t = LP.shape
    rollout = Rollout(prompt_ids=[[1]] * b, response_ids=torch.ones(b, t, dtype=torch.long),
                      response_mask=MASK.clone(), rollout_logprobs=LP.clone(), group_ids=torch.tensor([0, 0]),
                      truncated=torch.zeros(b, dtype=torch.bool))
    return StepBatch(rollout, torch.tensor(rewards, dtype=torch.float64), ref_logprobs=ref)


def test_distill_bundle_loss_through_the_step_by_hand():
    run = policyzoo.assemble({"base": "distill", "sample": {"n": 2}})
    assert needs_reference(run) and not needs_reference(policyzoo.assemble("dapo"))
    assert run.kl is None and [t.name for t in run.term] == ["distill"]
    # equal rewards: advantage 0, the clip's loss is 0; the loss is token_mean of coef x k1 over the
    # 5 masked tokens: (0.5 - 1.0 + 0.0 - 1.0 + 3.0) / 5 = 0.3; its gradient k1 / 5 per token
    batch, _ = prepare(run, _batch([1.0, 1.0], TEACHER.clone()))
    lp = LP.clone().requires_grad_(True)
    loss, metrics = micro_loss(run, batch, lp, step_totals(batch))
    assert math.isclose(float(loss), 0.3, rel_tol=1e-12)
    loss.backward()
    expect = torch.tensor([[0.5, -1.0, 0.0], [0.0, -1.0, 3.0]], dtype=torch.float64) / 5
    assert torch.allclose(lp.grad, expect, atol=1e-15)
    total, count = metrics["term/distill"]
    assert math.isclose(total / count, 0.3, rel_tol=1e-12)  # the reverse-KL estimate, nats per token
    # without the teacher's log-probs the component is named
    batch, _ = prepare(run, _batch([1.0, 1.0], None))
    with pytest.raises(ComponentError, match="distill"):
        micro_loss(run, batch, LP.clone().requires_grad_(True), step_totals(batch))


@pytest.fixture(scope="module")
def teachers(tmp_path_factory):
    """A teacher from another seed with one more layer (same byte tokenizer), and a copy of it whose
    tokenizer maps two tokens to each other's ids."""
    root = tmp_path_factory.mktemp("teachers")
    good = build_tiny_model(root / "seed1", seed=1, layers=3)
    bad = root / "swapped"
    shutil.copytree(good, bad)
    spec = json.loads((bad / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[10:12]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # ids 10 and 11 trade tokens
    (bad / "tokenizer.json").write_text(json.dumps(spec))
    return good, bad


def _config(tmp_path, *extra, algo="distill"):
    rows = tmp_path / "d.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"what is {i} + 1?", "answer": str(i + 1)}) + "\n"
                            for i in range(8)))
    return load_config(None, algo, [f"model.path={tiny_model()}", "algorithm.sample.max_tokens=12",
                                    "train.prompts_per_step=2", f"data.path={rows}", "rewards=[{use: answer_match}]",
                                    f"output_dir={tmp_path / 'run'}", *extra])


def test_teacher_checks_before_any_model_loads(tmp_path, teachers, monkeypatch):
    monkeypatch.setenv("POLICYZOO_CACHE", str(tmp_path / "cache"))
    good, bad = teachers
    pre = preload(_config(tmp_path, f"model.teacher={good}"), dry_run=True)
    assert pre.teacher.path == good
    cases = [
        ((f"model.teacher={bad}",), "distill", "model.teacher", "another vocabulary"),
        ((), "distill", "algorithm.term", "model.teacher is not set"),
        ((f"model.teacher={good}",), "grpo", "model.teacher", "no component reads it"),
        ((f"model.teacher={good}", "algorithm.kl={use: k3}"), "distill", "model.teacher", "KL to the teacher"),
        ((f"model.teacher={tmp_path / 'none'}",), "distill", "model.teacher", "does not exist"),
    ]
    for extra, algo, where, why in cases:
        config = _config(tmp_path, *extra, algo=algo)
        with pytest.raises(Exception) as e:
            check_teacher(config, policyzoo.assemble(config.algorithm), pre.model)
        assert e.value.where.startswith(where) and why in e.value.why, (extra, e.value)
        assert isinstance(e.value, policyzoo.UserError)


def test_vocabulary_mismatch_message_names_a_token(tmp_path, teachers):
    good, bad = teachers
    from policyzoo.engine.models import resolve_model

    student = resolve_model(str(tiny_model()))
    run = policyzoo.assemble("distill")
    with pytest.raises(ConfigError) as e:
        check_teacher(_config(tmp_path, f"model.teacher={bad}"), run, student)
    # the fixture swapped the tokens of ids 10 and 11: the first difference is at id 10
    vocab = student.tokenizer.get_vocab()
    a, b = sorted(vocab, key=vocab.get)[10:12]
    first = min(a, b)
    side = "the student's" if vocab[first] == 10 else "the teacher's"
    assert f"e.g. {first!r} is id 10 only in {side}" in e.value.why, e.value.why
