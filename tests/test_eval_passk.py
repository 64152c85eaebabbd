"""Held-out evaluation with several responses per prompt: the unbiased pass@k estimator, maj@k and
mean@k worked by hand, the ``eval:`` settings checked before any model loads, and held-out rows
split by distinct prompt."""

from __future__ import annotations

import json
import math

import pytest
import torch

from policyzoo.contract import Rollout
from policyzoo.data import DataSettings, load_task
from policyzoo.engine.run.evaluate import evaluate, majority_correct, pass_at_k, sample_metrics
from policyzoo.errors import ConfigError
from policyzoo.plugins.reward import AnswerMatch
from policyzoo.run_config import load_config


def test_pass_at_k_is_the_unbiased_estimator_worked_by_hand():
    # 1 - C(n-c, k) / C(n, k)
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)  # C(2,2)=1, C(4,2)=6
    assert pass_at_k(5, 1, 2) == pytest.approx(1 - 6 / 10)  # C(4,2)=6, C(5,2)=10 -> 0.4
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 = c / n
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)  # C(7,5)=21, C(10,5)=252
    assert pass_at_k(3, 0, 3) == 0.0 and pass_at_k(3, 1, 3) == 1.0 and pass_at_k(4, 3, 2) == 1.0  # n-c < k
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_majority_vote_ties_go_to_the_answer_seen_first():
    assert majority_correct(["7", "5", "7"], [True, False, True]) is True
    assert majority_correct(["5", "7", "7", "5"], [False, True, True, False]) is False  # 2-2 tie: "5" first
    assert majority_correct(["5", "7", "7"], [False, True, True]) is True


def test_sample_metrics_over_problems():
    # problem 0: rewards 1,0,1,0 with answers 4,3,4,3 ; problem 1: 0,0,0,1 with answers 9,9,8,6
    scores = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    texts = ["Answer: 4", "Answer: 3", "4", "3", "9", "Answer: 9", "8", "6"]
    m = sample_metrics(scores, texts, [1, 2, 4], 1.0)
    assert m["eval_pass@1"] == pytest.approx((2 / 4 + 1 / 4) / 2)  # c/n per problem
    assert m["eval_pass@2"] == pytest.approx(((1 - 1 / 6) + (1 - 3 / 6)) / 2)  # C(3,2)=3 for c=1
    assert m["eval_pass@4"] == 1.0
    assert m["eval_maj@1"] == 0.5  # first responses: correct, wrong
    assert m["eval_maj@2"] == 0.5  # p0: 4 vs 3 tie -> 4 (correct); p1: 9 9 -> wrong
    assert m["eval_maj@4"] == 0.5  # p0: 4,3 tie -> 4; p1: 9 twice -> wrong
    assert m["eval_mean@4"] == pytest.approx((0.5 + 0.25) / 2)
    nan = sample_metrics(torch.tensor([[math.nan, 1.0]]), ["1", "2"], [1], 1.0)
    assert nan["eval_pass@1"] == 0.5 and nan["eval_mean@2"] == 1.0  # NaN: not correct, left out of the mean


class SampledEngine:
    """A rollout engine whose i-th call answers with ``answers`` (prompt-major), recording calls."""

    def __init__(self, answers):
        self.answers, self.calls = answers, []

    def generate(self, rows, n, max_tokens, temperature, seed):
        self.calls.append(("generate", n, temperature, seed))
        b = len(rows) * n
        return Rollout(prompt_ids=[[1]] * b, response_ids=torch.full((b, 2), 5),
                       response_mask=torch.ones(b, 2, dtype=torch.bool), rollout_logprobs=torch.zeros(b, 2),
                       group_ids=torch.arange(len(rows)).repeat_interleave(n),
                       truncated=torch.zeros(b, dtype=torch.bool),
                       prompts=["p"] * b, completions=self.answers, rows=[r for r in rows for _ in range(n)])


def test_evaluate_samples_n_per_prompt_and_reports_every_k():
    rows = [{"prompt": "a", "answer": "4"}, {"prompt": "b", "answer": "6"}]
    engine = SampledEngine(["Answer: 4", "Answer: 5", "Answer: 5", "Answer: 6", "Answer: 6", "Answer: 1"])
    m = evaluate(engine, [AnswerMatch()], rows, 8, n=3, temperature=0.7, ks=[1, 3], seed=5)
    assert engine.calls == [("generate", 3, 0.7, 5)]
    assert m["eval_n"] == 3 and m["eval_rows"] == 2
    assert m["eval_accuracy"] == pytest.approx(3 / 6)  # 4 | 6, 6 correct
    assert m["eval_pass@1"] == pytest.approx((1 / 3 + 2 / 3) / 2)
    assert m["eval_pass@3"] == 1.0
    assert m["eval_maj@3"] == 0.5  # p0: 5 twice (wrong); p1: 6 twice (right)
    assert m["eval_mean@3"] == pytest.approx(0.5)


def test_eval_settings_are_checked_before_any_model_loads():
    c = load_config(None, "grpo", ["eval.n=8", "eval.temperature=0.6"])
    assert c.eval.ks() == [1, 2, 4, 8]
    assert load_config(None, "grpo", ["eval.n=6", "eval.temperature=1.0"]).eval.ks() == [1, 2, 4, 6]
    assert load_config(None, "grpo", []).eval.ks() == [1]
    with pytest.raises(ConfigError, match="eval.temperature"):
        load_config(None, "grpo", ["eval.n=4"])  # 4 greedy copies of one answer
    with pytest.raises(ConfigError, match=r"eval.k \[5\]"):
        load_config(None, "grpo", ["eval.n=4", "eval.temperature=1", "eval.k=[2,5]"])


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_held_out_prompts_are_never_trained_on(tmp_path):
    # 6 distinct questions, each 3 times: 18 rows. 2 held out -> their 4 repeats leave training.
    rows = [{"q": f"What is {i} + 1?", "a": str(i + 1)} for i in range(6)] * 3
    task = load_task(DataSettings(path=write_jsonl(tmp_path / "d.jsonl", rows), prompt_column="q", answer_column="a",
                                  eval_size=2))
    held = {r["q"] for r in task.eval_rows}
    assert len(held) == 2 and len(task.eval_rows) == 2
    assert not held & {r["q"] for r in task.train_rows} and len(task.train_rows) == 18 - 2 - 4
    assert any("4 rows" in w and "repeat a held-out prompt" in w for w in task.warnings)


def test_a_separate_held_out_file_warns_with_the_overlap_count(tmp_path):
    train = [{"q": f"What is {i} + 1?", "a": str(i + 1)} for i in range(10)]
    held = train[:3] + [{"q": "What is 99 + 1?", "a": "100"}]  # 3 of 4 held-out prompts are trained on
    task = load_task(DataSettings(path=write_jsonl(tmp_path / "t.jsonl", train), prompt_column="q",
                                  answer_column="a", eval_path=write_jsonl(tmp_path / "e.jsonl", held), eval_size=4))
    assert any("3 of the 4 held-out prompts" in w for w in task.warnings)
