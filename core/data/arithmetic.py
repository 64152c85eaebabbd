"""The default task: few-shot 1-2 digit addition and subtraction, generated from a seed.

Each problem draws, from ``random.Random(seed)``: the operator (``+`` or ``-``, probability 1/2
each), then two operands, each with 1 digit (0-9) with probability ``ONE_DIGIT`` = 0.7, else 2
digits (10-99); so 49% of problems have two 1-digit operands.
Subtraction puts the larger operand first, so every answer is a non-negative integer.
Held-out problems are drawn first and are distinct; example and training problems never equal a
held-out one (training problems may repeat, as draws from the same distribution).

Why this task: it gives SmolLM2-135M-Instruct a learning signal. Measured with this prompt
(transformers sampling, temperature 1, 8 samples per problem, strict ``answer_match``): the first
48 training problems of seed 0 were answered right 0.35 of the time and 67% of their groups mixed
right and wrong answers; the first 48 held-out problems 0.15 and 40% (held-out problems are
distinct, so they hold fewer of the 155 problems with two 1-digit operands: 36% of them, against
42% of training draws). Problems with two 1-digit operands: 0.31-0.46; the rest: 0.06-0.16.
With ``ONE_DIGIT`` = 0.5 the held-out numbers were 0.10 and 31%.
"""

from __future__ import annotations

import random

SYSTEM_PROMPT = ("Solve the arithmetic problem. Reply with the result only, "
                 "in the form 'Answer: <n>' where <n> is an integer.")
DEFAULT_TRAIN_SIZE = 5000
ONE_DIGIT = 0.7  # P(an operand has 1 digit); see "Why this task" above for the choice
DISTINCT = 100 * 100 + 100 * 101 // 2  # sums of a, b in 0..99, and differences a - b with a >= b


def draw_problem(rng: random.Random) -> tuple[int, str, int]:
    """One problem ``(a, op, b)``; see the module docstring for the distribution."""
    op = rng.choice("+-")
    a, b = (rng.randint(0, 9) if rng.random() < ONE_DIGIT else rng.randint(10, 99) for _ in range(2))
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
