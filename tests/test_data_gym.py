"""data.name: reasoning_gym (policyzoo.data.gym) and its gym_score reward: rows shared out by
weight, held-out rows disjoint from training by seed and by question text, the task's own
scorer on the <answer> tag, per-task held-out accuracy, and every bad input as a UserError."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from _engine_helpers import ROOT

from policyzoo.contract import Rollout
from policyzoo.data import load_task
from policyzoo.data.gym import generate, split_counts
from policyzoo.data.task import _settings
from policyzoo.engine.run.evaluate import per_task_accuracy
from policyzoo.errors import ConfigError, DataError, UserError
from policyzoo.plugins.reward import GymScore, GymScoreError

MIX = {"name": "reasoning_gym", "tasks": {"basic_arithmetic": 2, "chain_sum": 1}, "size": 30, "eval_size": 9,
       "seed": 11}


def rollout_of(rows: list[dict], completions: list[str]) -> Rollout:
    b = len(rows)
    return Rollout(prompt_ids=[[1]] * b, response_ids=torch.zeros(b, 1, dtype=torch.long),
                   response_mask=torch.ones(b, 1, dtype=torch.bool), rollout_logprobs=torch.zeros(b, 1),
                   group_ids=torch.arange(b), truncated=torch.zeros(b, dtype=torch.bool),
                   prompts=[""] * b, completions=completions, rows=rows)


def test_the_trap_seeds_overlap_in_reasoning_gym_itself():
    import reasoning_gym

    # item i comes from Random(seed + i): seed 22 with 100 rows is items 22..121, all inside seed 11's 11..410
    a = {e["question"] for e in reasoning_gym.create_dataset("basic_arithmetic", seed=11, size=400)}
    b = [e["question"] for e in reasoning_gym.create_dataset("basic_arithmetic", seed=22, size=100)]
    assert sum(q in a for q in b) == 100


def test_weights_share_out_rows_by_largest_remainder():
    # 10 rows at 2:1 -> 6.67 and 3.33 -> 6 + 3 = 9, the larger remainder (a) gets the 10th: 7, 3
    assert split_counts({"a": 2.0, "b": 1.0}, 10) == {"a": 7, "b": 3}
    # 9 rows at 2:1 -> exactly 6 and 3; 5 rows at 1:1:1 -> 1.67 each, ties in the given order: 2, 2, 1
    assert split_counts({"a": 2.0, "b": 1.0}, 9) == {"a": 6, "b": 3}
    assert split_counts({"x": 1.0, "y": 1.0, "z": 1.0}, 5) == {"x": 2, "y": 2, "z": 1}


def test_held_out_rows_are_disjoint_from_training_by_seed_and_by_question():
    train, held, warnings, plan = generate(_settings(MIX))
    assert plan == {"basic_arithmetic": (20, 6), "chain_sum": (10, 3)}  # 30 rows 2:1, 9 held-out rows 2:1
    for task, (n, e) in plan.items():
        seeds_train = sorted(r["_seed"] for r in train if r["_task"] == task)
        seeds_held = sorted(r["_seed"] for r in held if r["_task"] == task)
        assert seeds_train == list(range(11, 11 + n))  # training: items seed .. seed + n - 1
        assert seeds_held == list(range(11 + n, 11 + n + e))  # held out: the items after them
    assert {r["question"] for r in train} & {r["question"] for r in held} == set()
    assert warnings == []


def test_a_repeated_question_leaves_training(monkeypatch):
    import reasoning_gym

    real = reasoning_gym.create_dataset

    def fake(name, seed, size, **kw):  # every held-out item (seed 13) repeats training item 0 (seed 11)
        rows = list(real(name, seed=seed, size=size, **kw))
        if seed == 13:
            rows[0] = {**rows[0], "question": list(real(name, seed=11, size=1))[0]["question"]}
        return rows
    monkeypatch.setattr(reasoning_gym, "create_dataset", fake)
    train, held, warnings, _ = generate(_settings({"name": "reasoning_gym", "tasks": "chain_sum", "size": 2,
                                                   "eval_size": 1, "seed": 11}))
    assert len(train) == 1 and len(held) == 1  # 2 training rows, the one repeating the held-out question left out
    assert "1 generated training rows" in warnings[0]


def test_task_rows_prompt_and_default_reward():
    import reasoning_gym

    task = load_task(MIX)
    assert (len(task.train_rows), len(task.eval_rows)) == (30, 9)
    row = task.train_rows[0]
    assert row["prompt"] == [{"role": "system", "content": reasoning_gym.utils.SYSTEM_PROMPTS["default"]},
                             {"role": "user", "content": row["question"]}]
    assert [u.name for u in task.default_rewards] == ["gym_score"]
    assert task.train_origins[0] == "data (reasoning_gym), training basic_arithmetic item seed 11"
    # data.use is another name for data.name
    assert load_task({**{k: v for k, v in MIX.items() if k != "name"}, "use": "reasoning_gym"}).name == "reasoning_gym"


def test_gym_score_is_the_tasks_own_scorer_on_the_answer_tag():
    task = load_task({**MIX, "size": 3, "eval_size": 0, "tasks": "basic_arithmetic"})
    rows = task.train_rows
    gold = rows[0]["answer"]
    texts = [f"so <answer>{gold}</answer>", f"{gold}", "<answer>not a number</answer>"]
    # tagged gold: 1.0; no tags -> extract_answer None -> 0.0; a wrong answer: 0.0
    assert GymScore().reward(rollout=rollout_of([rows[0]] * 3, texts)).tolist() == [1.0, 0.0, 0.0]


def test_a_failing_or_nan_scorer_stops_with_the_task_and_row(monkeypatch):
    rows = load_task({**MIX, "size": 1, "eval_size": 0, "tasks": "chain_sum"}).train_rows
    comp = GymScore()
    scorer = comp.scorer("chain_sum", {})
    for bad, words in ((lambda a, e: 1 / 0, "score_answer raised ZeroDivisionError"),
                       (lambda a, e: math.nan, "returned nan"), (lambda a, e: "1", "returned '1'")):
        monkeypatch.setattr(scorer, "score_answer", bad)
        with pytest.raises(GymScoreError, match=words) as e:
            comp.reward(rollout=rollout_of(rows, ["<answer>1</answer>"]))
        assert "gym_score (chain_sum), row 0" in str(e.value)
    with pytest.raises(DataError, match="not a reasoning-gym row"):
        comp.reward(rollout=rollout_of([{"answer": "1"}], ["1"]))


def test_per_task_accuracy():
    # 3 rows x n=2 responses, prompt-major: a: rows 0, 2 -> [1, 0, 1, NaN] -> 2/3; b: row 1 -> [0, 0] -> 0
    total = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, math.nan])
    got = per_task_accuracy(total, ["a", "b", "a"], 2)
    assert list(got) == ["eval_accuracy/a", "eval_accuracy/b"]
    assert got["eval_accuracy/a"] == pytest.approx(2 / 3) and got["eval_accuracy/b"] == 0.0  # float32 mean
    assert per_task_accuracy(total, [None, None, None], 2) == {}


@pytest.mark.parametrize("data, where, words", [
    ({"tasks": "basic_arithmetc"}, "data.tasks (basic_arithmetc)", "did you mean basic_arithmetic"),
    ({"tasks": None}, "data.tasks", "needs at least one task"),
    ({"tasks": {"chain_sum": 0}}, "data.tasks (chain_sum)", "not a positive number"),
    ({"tasks": "chain_sum", "task_settings": {"chain_sum": {"min_term": 2}}},
     "data.task_settings.chain_sum.min_term", "did you mean min_terms"),
    ({"tasks": "chain_sum", "task_settings": {"chain_sum": {"min_terms": 9, "max_terms": 2}}},
     "data.task_settings.chain_sum", "refuses these settings"),
    ({"tasks": "chain_sum", "task_settings": {"basic_arithmetic": {}}}, "data.task_settings.basic_arithmetic",
     "is not one of data.tasks"),
])
def test_bad_settings_are_config_errors(data, where, words):
    with pytest.raises(ConfigError, match=words) as e:
        load_task({"name": "reasoning_gym", "size": 4, "eval_size": 1, **data})
    assert e.value.where == where
    if "did you mean basic" in words:
        assert "policyzoo data reasoning_gym" in e.value.fix


def test_gym_keys_are_refused_for_other_sources():
    with pytest.raises(ConfigError, match="applies to data.name: reasoning_gym"):
        load_task({"name": "gsm8k", "tasks": "chain_sum"})


def test_a_missing_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import raises ImportError
    with pytest.raises(UserError, match="not installed") as e:
        load_task({"name": "reasoning_gym", "tasks": "chain_sum"})
    assert "policyzoo[gym]" in e.value.fix


def test_cli_lists_the_tasks_and_a_dry_run_refuses_an_unknown_one():
    out = subprocess.run([sys.executable, "-m", "policyzoo.cli", "data", "reasoning_gym"], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0 and "basic_arithmetic" in out.stdout and "chain_sum" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "policyzoo.cli", "train", "--algo", "grpo", "--dry-run",
                          "data.use=reasoning_gym", "data.tasks=[chain_sum, basic_arithmetc]"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert bad.returncode == 2, bad.stderr[-2000:]
    assert "no task 'basic_arithmetc'" in bad.stderr and "policyzoo data reasoning_gym" in bad.stderr


def test_limit_caps_the_size_and_task_scores_rows_of_other_sources():
    # size 30 capped by limit 6 -> 6 training rows (2:1 -> 4 + 2), eval_size 3 -> 2 + 1
    task = load_task({**MIX, "limit": 6, "eval_size": 3})
    assert (len(task.train_rows), len(task.eval_rows)) == (6, 3)
    # a saved entry without _gym, scored as basic_arithmetic: its answer in tags 1.0, another number 0.0
    row = {"question": "Calculate 2 + 3.", "answer": "5", "metadata": {}}
    got = GymScore(task="basic_arithmetic").reward(rollout=rollout_of([row, row], ["<answer>5</answer>",
                                                                                   "<answer>6</answer>"]))
    assert got.tolist() == [1.0, 0.0]
    with pytest.raises(ConfigError, match="did you mean basic_arithmetic") as e:
        GymScore(task="basic_arithmetc")
    assert e.value.where == "reward: gym_score (task)"


def test_few_shot_examples_come_after_the_held_out_items_and_are_answered_in_tags():
    import reasoning_gym

    task = load_task({**MIX, "few_shot": 3})
    prompt = task.train_rows[0]["prompt"]
    # system, then 3 x (user, assistant), then the row's own question: 1 + 6 + 1 = 8 messages
    assert [m["role"] for m in prompt] == ["system"] + ["user", "assistant"] * 3 + ["user"]
    # round-robin over the tasks: basic_arithmetic, chain_sum, basic_arithmetic; each task's first items after its
    # held-out range: basic_arithmetic 20 + 6 rows from seed 11 -> seed 37, chain_sum 10 + 3 -> seed 24
    a = reasoning_gym.create_dataset("basic_arithmetic", seed=11 + 20 + 6, size=2)
    c = reasoning_gym.create_dataset("chain_sum", seed=11 + 10 + 3, size=1)
    assert [m["content"] for m in prompt[1:7]] == [a[0]["question"], f"<answer>{a[0]['answer']}</answer>",
                                                   c[0]["question"], f"<answer>{c[0]['answer']}</answer>",
                                                   a[1]["question"], f"<answer>{a[1]['answer']}</answer>"]
    shown = {prompt[i]["content"] for i in (1, 3, 5)}
    own = {r["prompt"][-1]["content"] for r in task.train_rows + task.eval_rows}
    assert shown & own == set()  # no example is a training or a held-out question
    assert task.eval_rows[0]["prompt"][1:7] == prompt[1:7]  # the same examples before held-out questions


def test_reasoning_gym_has_no_examples_unless_asked():
    assert [m["role"] for m in load_task(MIX).train_rows[0]["prompt"]] == ["system", "user"]
