"""The default task: generated 1-2 digit addition/subtraction with few-shot chat prompts."""

import re

import pytest

from policyzoo.data import DataSettings, arithmetic, load_task


class Scripted:
    """A stand-in for random.Random that returns scripted draws, so a problem can be checked by hand."""

    def __init__(self, op, uniforms, ints):
        self.op, self.uniforms, self.ints = op, list(uniforms), list(ints)

    def choice(self, seq):
        assert self.op in seq
        return self.op

    def random(self):
        return self.uniforms.pop(0)

    def randint(self, lo, hi):
        value = self.ints.pop(0)
        assert lo <= value <= hi
        return value


def test_draw_problem_by_hand():
    # op '-'; first operand: uniform 0.2 < 0.7 -> 1 digit, randint(0, 9) -> 4;
    # second: 0.8 >= 0.7 -> 2 digits, randint(10, 99) -> 57. Subtraction puts the larger first: 57 - 4.
    assert arithmetic.draw_problem(Scripted("-", [0.2, 0.8], [4, 57])) == (57, "-", 4)
    # op '+': both 2 digits (0.9, 0.7 >= 0.7): 38 + 45, order kept.
    assert arithmetic.draw_problem(Scripted("+", [0.9, 0.7], [38, 45])) == (38, "+", 45)


def test_problem_row_by_hand():
    row = arithmetic.problem_row(57, "-", 4)
    assert row["question"] == "What is 57 - 4?" and row["answer"] == "53"  # 57 - 4 = 53
    assert arithmetic.problem_row(38, "+", 45)["answer"] == "83"  # 38 + 45 = 83
    assert arithmetic.solved(row) == "Answer: 53"


def _parse(question):
    a, op, b = re.fullmatch(r"What is (\d+) ([+-]) (\d+)\?", question).groups()
    return int(a), op, int(b)


def test_every_answer_is_the_arithmetic_of_its_question():
    task = load_task(DataSettings(limit=500, eval_size=50))
    for row in task.train_rows + task.eval_rows:
        a, op, b = _parse(row["question"])
        assert 0 <= a <= 99 and 0 <= b <= 99
        assert int(row["answer"]) == (a + b if op == "+" else a - b) >= 0
        assert (row["a"], row["op"], row["b"]) == (a, op, b)


def test_default_prompt_has_system_two_solved_examples_and_the_question():
    task = load_task(DataSettings(limit=10, eval_size=5))
    row = task.train_rows[0]
    roles = [m["role"] for m in row["prompt"]]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
    assert "Answer: <n>" in row["prompt"][0]["content"]
    assert row["prompt"][-1]["content"] == row["question"]
    for user, assistant in (row["prompt"][1:3], row["prompt"][3:5]):
        a, op, b = _parse(user["content"])
        assert assistant["content"] == f"Answer: {a + b if op == '+' else a - b}"
    # every row shares the same examples
    assert all(r["prompt"][:5] == row["prompt"][:5] for r in task.train_rows + task.eval_rows)


def test_few_shot_and_system_prompt_are_settable():
    task = load_task(DataSettings(limit=3, eval_size=2, few_shot=0, system_prompt=""))
    assert [m["role"] for m in task.train_rows[0]["prompt"]] == ["user"]
    task = load_task(DataSettings(limit=3, eval_size=2, few_shot=4))
    assert len(task.train_rows[0]["prompt"]) == 1 + 2 * 4 + 1


def test_deterministic_in_seed_and_held_out_is_disjoint():
    a = load_task(DataSettings(seed=3, limit=2000))
    b = load_task(DataSettings(seed=3, limit=2000))
    c = load_task(DataSettings(seed=4, limit=2000))
    assert a.train_rows == b.train_rows and a.eval_rows == b.eval_rows
    assert [r["question"] for r in a.eval_rows] != [r["question"] for r in c.eval_rows]
    held = {r["question"] for r in a.eval_rows}
    shots = {m["content"] for m in a.train_rows[0]["prompt"] if m["role"] == "user"} - {a.train_rows[0]["question"]}
    assert len(held) == 100 and len(shots) == 2
    assert not held & {r["question"] for r in a.train_rows} and not held & shots
    assert not shots & {r["question"] for r in a.train_rows}
    assert len(a.train_rows) == 2000


def test_distribution_is_half_plus_and_seventy_percent_one_digit_operands():
    import random

    rng = random.Random(0)
    draws = [arithmetic.draw_problem(rng) for _ in range(20000)]
    plus = sum(op == "+" for _, op, _ in draws) / len(draws)
    one_digit = sum((a < 10) + (b < 10) for a, _, b in draws) / (2 * len(draws))
    # P(+) = 1/2, P(1-digit operand) = 0.7 (subtraction only swaps operands, so the count of 1-digit
    # operands per problem is unchanged). Binomial sds: sqrt(.25/20000) = 0.0035, sqrt(.21/40000) = 0.0023.
    assert abs(plus - 0.5) < 0.015 and abs(one_digit - 0.7) < 0.01


def test_arithmetic_rejects_column_settings():
    from policyzoo.errors import ConfigError

    with pytest.raises(ConfigError, match="data.path"):
        load_task({"prompt_column": "q"})
    # 1-2 digit problems: 100 x 100 sums + 5050 differences = 15050 distinct; 20000 cannot be held out
    with pytest.raises(ConfigError, match="distinct"):
        load_task({"eval_size": 20000})


def test_default_reward_is_answer_match_and_assembles():
    import policyzoo

    task = load_task(DataSettings(limit=2, eval_size=1))
    assert [u.name for u in task.default_rewards] == ["answer_match"]
    run = policyzoo.assemble("grpo", rewards=tuple(task.default_rewards))
    assert [c.name for c in run.reward] == ["answer_match"]
