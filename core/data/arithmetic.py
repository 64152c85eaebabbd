"""The default task: few-shot 1-2 digit addition and subtraction, generated from a seed.

Each problem draws, from ``random.Random(seed)``: the operator (``+`` or ``-``, probability 1/2
each), then two operands, each with 1 digit (0-9) or 2 digits (10-99) with probability 1/2 each.
Subtraction puts the larger operand first, so every answer is a non-negative integer.
Held-out problems are drawn first and are distinct; example and training problems never equal a
held-out one (training problems may repeat, as draws from the same distribution).

Why this task: SmolLM2-135M-Instruct, prompted with two solved examples in the chat, is right
on ~0.13 (2-digit) to ~0.82 (1-digit) of such problems at temperature 1, and about half of its
groups of 8 samples mix right and wrong answers, so group baselines have a signal to learn from.
"""

from __future__ import annotations

import random

SYSTEM_PROMPT = ("Solve the arithmetic problem. Reply with the result only, "
                 "in the form 'Answer: <n>' where <n> is an integer.")
DEFAULT_TRAIN_SIZE = 5000
DISTINCT = 100 * 100 + 100 * 101 // 2  # sums of a, b in 0..99, and differences a - b with a >= b


def draw_problem(rng: random.Random) -> tuple[int, str, int]:
    """One problem ``(a, op, b)``; see the module docstring for the distribution."""
    op = rng.choice("+-")
    a, b = (rng.randint(0, 9) if rng.random() < 0.5 else rng.randint(10, 99) for _ in range(2))
    if op == "-" and b > a:
        a, b = b, a
    return a, op, b


def problem_row(a: int, op: str, b: int) -> dict:
    """A raw row: ``question`` ("What is 23 + 45?"), integer ``answer`` and the operands."""
    value = a + b if op == "+" else a - b
    return {"question": f"What is {a} {op} {b}?", "answer": str(value), "a": a, "op": op, "b": b}


def solved(row: dict) -> str:
    """The assistant's reply to a solved example: ``Answer: <n>``."""
    return f"Answer: {row['answer']}"


def generate(seed: int, n_eval: int, n_examples: int, n_train: int) -> tuple[list[dict], list[dict], list[dict]]:
    """``(eval_rows, example_rows, train_rows)`` as raw rows, deterministic in ``seed``.

    Raises ValueError if more distinct held-out/example problems are asked than exist."""
    if n_eval + n_examples > DISTINCT:
        raise ValueError(f"cannot draw {n_eval + n_examples} distinct arithmetic problems (there are {DISTINCT})")
    rng = random.Random(seed)
    held: dict[tuple, None] = {}
    for n in (n_eval, n_eval + n_examples):
        tries = 0
        while len(held) < n:
            held.setdefault(draw_problem(rng))
            tries += 1
            if tries > 100 * (n + 10):
                raise ValueError(f"cannot draw {n} distinct arithmetic problems")
    problems = list(held)
    train = []
    while len(train) < n_train:
        p = draw_problem(rng)
        if p not in held:
            train.append(p)
    return ([problem_row(*p) for p in problems[:n_eval]], [problem_row(*p) for p in problems[n_eval:]],
            [problem_row(*p) for p in train])
