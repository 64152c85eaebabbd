"""The math_verify reward: math-verify's parse + verify of the completion against row["answer"]."""

import builtins
import threading

import pytest
import torch

from policyzoo.contract import Rollout
from policyzoo.errors import DataError, UserError
from policyzoo.plugins.reward import MathVerify


def rollout(completions, answers):
    b = len(completions)
    return Rollout(prompt_ids=[[1]] * b, response_ids=torch.zeros(b, 1, dtype=torch.long),
                   response_mask=torch.ones(b, 1, dtype=torch.bool), rollout_logprobs=torch.zeros(b, 1),
                   group_ids=torch.arange(b), truncated=torch.zeros(b, dtype=torch.bool),
                   prompts=["q"] * b, completions=list(completions), rows=[{"answer": a} for a in answers])


def test_boxed_plain_and_equivalent_forms():
    r = rollout(["The answer is \\boxed{42}", "Answer: 42", "so it is 41", "no number at all",
                 "\\boxed{\\frac{1}{2}}", "\\boxed{1,000}"],
                ["42", "42", "42", "42", "0.5", "1000"])
    # 42 = 42 (boxed); 42 = 42 (plain last number); 41 != 42; nothing extracted -> wrong;
    # 1/2 = 0.5 symbolically; 1,000 = 1000
    assert MathVerify().reward(r).tolist() == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]


def test_weight_is_a_parameter_and_result_is_float32():
    comp = MathVerify(weight=0.5)
    assert comp.params.weight == 0.5
    assert MathVerify().reward(rollout(["\\boxed{7}"], ["7"])).dtype == torch.float32


def test_works_off_the_main_thread():
    # math-verify's own timeout uses signal.alarm, which only works in the main thread
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", MathVerify().reward(rollout(["\\boxed{3}"], ["3"]))))
    t.start()
    t.join()
    assert out["r"].tolist() == [1.0]


def test_unparsable_reference_answer_names_the_row():
    with pytest.raises(DataError) as e:
        MathVerify().reward(rollout(["\\boxed{3}", "\\boxed{3}"], ["3", ""]))
    assert "row 1" in e.value.where


def test_missing_package_says_how_to_install(monkeypatch):
    real = builtins.__import__

    def fake(name, *a, **kw):
        if name == "math_verify":
            raise ImportError(name)
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(UserError, match="pip install math-verify"):
        MathVerify()


def test_is_in_the_catalog():
    import policyzoo

    run = policyzoo.assemble("grpo", rewards=(policyzoo.use("math_verify", weight=2.0),))
    assert [(c.name, c.params.weight) for c in run.reward] == [("math_verify", 2.0)]
