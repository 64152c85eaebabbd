"""``env`` components: environments for multi-turn, tool-using episodes (see :mod:`policyzoo.step.episodes`).

The calculator tool is safe by construction: :func:`calc` parses the expression with its own
recursive-descent grammar over numbers, ``+ - * /`` and parentheses and computes it with exact
fractions -- no ``eval``, no shell, no names, no powers; the length and nesting of an expression
are bounded, so no call can run long or allocate much.
"""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction

from pydantic import Field

from policyzoo.contract import Env, Episode, Observation
from policyzoo.data.answers import extract_number

MAX_EXPR_CHARS = 120
MAX_DEPTH = 12
_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?|\.\d+)|(.))")


class CalcError(ValueError):
    """An expression the calculator refuses (syntax, division by zero, too long, too deep)."""


def calc(expr: str) -> str:
    """The value of an arithmetic expression as text: integers exactly ("12"), other values as a
    decimal rounded to 6 places ("0.333333"). Grammar: ``expr = term (("+"|"-") term)*``,
    ``term = unary (("*"|"/") unary)*``, ``unary = "-" unary | "(" expr ")" | number``; commas in
    numbers are ignored. Raises :class:`CalcError` for anything else, division by zero, more than
    ``MAX_EXPR_CHARS`` characters or ``MAX_DEPTH`` nested parentheses / signs."""
    text = expr.replace(",", "").strip()
    if not text:
        raise CalcError("empty expression")
    if len(text) > MAX_EXPR_CHARS:
        raise CalcError(f"expression longer than {MAX_EXPR_CHARS} characters")
    tokens = [m.group(1) or m.group(2) for m in _TOKEN.finditer(text) if (m.group(1) or m.group(2) or "").strip()]
    value = _Parser(tokens).parse()
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6f}".rstrip("0").rstrip(".")


class _Parser:
    """Recursive descent over ``tokens`` by :func:`calc`'s grammar, exact in :class:`Fraction`."""

    def __init__(self, tokens: list[str]):
        self.tokens, self.pos = tokens, 0

    def parse(self) -> Fraction:
        value = self.expr(0)
        if self.pos != len(self.tokens):
            raise CalcError(f"unexpected {self.tokens[self.pos]!r}")
        return value

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        self.pos += 1
        return self.tokens[self.pos - 1]

    def expr(self, depth: int) -> Fraction:
        value = self.term(depth)
        while self.peek() in ("+", "-"):
            value = value + self.term(depth) if self.take() == "+" else value - self.term(depth)
        return value

    def term(self, depth: int) -> Fraction:
        value = self.unary(depth)
        while self.peek() in ("*", "/"):
            op, right = self.take(), self.unary(depth)
            if op == "/" and right == 0:
                raise CalcError("division by zero")
            value = value * right if op == "*" else value / right
        return value

    def unary(self, depth: int) -> Fraction:
        if depth > MAX_DEPTH:
            raise CalcError(f"more than {MAX_DEPTH} nested parentheses or signs")
        tok = self.peek()
        if tok == "-":
            self.take()
            return -self.unary(depth + 1)
        if tok == "(":
            self.take()
            value = self.expr(depth + 1)
            if self.peek() != ")":
                raise CalcError("missing ')'")
            self.take()
            return value
        if tok is not None and tok[0].isdigit() or (tok or "").startswith("."):
            return Fraction(Decimal(self.take()))
        raise CalcError(f"unexpected {tok!r}" if tok is not None else "unexpected end of expression")


def find_call(text: str) -> str | None:
    """The argument of the first ``calc(...)`` in ``text`` (balanced parentheses), or None."""
    start = text.find("calc(")
    if start < 0:
        return None
    depth, i = 1, start + 5
    while i < len(text) and depth:
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        i += 1
    return text[start + 5:i - 1] if depth == 0 else text[start + 5:]


CALC_SYSTEM = ("Solve the arithmetic problem. You have a calculator: to use it, reply with only "
               "calc(<expression>), e.g. calc(23 + 45), and you will get the result. Then reply with "
               "the result only, in the form 'Answer: <n>' where <n> is an integer.")
CALC_EXAMPLE = [{"role": "user", "content": "What is 17 + 25?"}, {"role": "assistant", "content": "calc(17 + 25)"},
                {"role": "tool", "content": "42"}, {"role": "assistant", "content": "Answer: 42"}]
GSM8K_CALC_SYSTEM = ("Solve the math word problem step by step. You have a calculator: to use it, reply with "
                     "only calc(<expression>), e.g. calc(12 * 7 - 5), and you will get the result; call it as "
                     "often as you need. Give the final answer as \\boxed{<number>}.")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


class CalcEpisode(Episode):
    """One calculator episode: a model turn holding ``calc(expr)`` gets the value (or an error) as
    a message of role ``tool_role``; a turn without a call is the final answer and ends it."""

    def __init__(self, row: dict, params, system: str, example: list[dict], boxed: bool):
        super().__init__(row)
        turns = [{"role": "user", "content": row["prompt"]}] if isinstance(row["prompt"], str) else [
            m for m in row["prompt"] if m.get("role") != "system"]  # the task's few-shot turns, then the question
        example = [dict(m, role=params.tool_role if m["role"] == "tool" else m["role"]) for m in example]
        self.prompt = [{"role": "system", "content": params.system_prompt or system},
                       *(turns[:-1] if params.task_examples else []), *(example if params.example else []),
                       turns[-1]]
        self.params, self.boxed, self.final = params, boxed, None

    def step(self, turn_text: str, turn_ids: list[int]) -> Observation:
        expr = find_call(turn_text)
        if expr is None:
            self.final = turn_text
            return Observation(done=True)
        try:
            result, error = calc(expr), False
        except CalcError as e:
            result, error = f"error: {e}", True
        return Observation(messages=[{"role": self.params.tool_role, "content": result}], tool_call=True,
                           tool_error=error, reward=None if error or not self.params.call_reward
                           else self.params.call_reward)

    def reward(self) -> float:
        """1.0 when the final answer equals the row's ``answer`` (as numbers), else 0.0 (also
        when the episode ended without a final answer)."""
        if self.final is None:
            return 0.0
        text = self.final
        if self.boxed:
            found = _BOXED.findall(text)
            text = found[-1] if found else ""
        got, gold = extract_number(text), extract_number(str(self.row.get("answer", "")))
        return 1.0 if got is not None and got == gold else 0.0


class Calculator(Env):
    """A calculator tool for the arithmetic task: the model may call ``calc(expr)`` and must answer.

    Reset: the prompt becomes the tool instructions (``system_prompt``), one worked example that
    calls the tool (``example``; after the task's own few-shot turns, which answer without the
    tool, if ``task_examples``), and the row's question (its last message); the task's system prompt is
    replaced. Step: the first ``calc(...)`` of a turn is
    computed by :func:`calc` (exact, no ``eval``) and answered as a ``tool_role`` message; a turn
    without a call is the final answer. Reward: 1.0 when the final answer ("Answer: n", else the
    last number of the final turn) equals the row's ``answer``, else 0.0. ``call_reward`` > 0
    adds that per-turn reward to every successful call (placed on the call's last token).
    Metrics: tool calls, tool errors (a refused expression), turns, budget truncations.
    Source: the tool-call loop of Schick et al. 2023 (Toolformer, arXiv:2302.04761), trained with
    RL as in TRL's ``environment_factory`` and verl's agent loop."""

    name = "calculator"
    system, example, boxed = CALC_SYSTEM, CALC_EXAMPLE, False

    class Params(Env.Params):
        max_turns: int = Field(3, ge=1, description="turn budget: model turns per episode (>= 1)")
        max_total_tokens: int = Field(192, ge=1, description="token budget: model + environment tokens "
                                      "after the prompt (>= 1)")
        system_prompt: str | None = Field(None, description="tool instructions; None = the built-in ones")
        example: bool = Field(True, description="put one worked tool-call example before the question")
        task_examples: bool = Field(False, description="keep the task's own few-shot turns (which answer "
                                    "without the tool) before the question")
        tool_role: str = Field("tool", description="chat role of the calculator's answers")
        call_reward: float = Field(0.0, description="per-turn reward of a successful calc call (0 = none)")

    def env(self, row):
        return CalcEpisode(row, self.params, self.system, self.example, self.boxed)


class GSM8KCalculator(Calculator):
    """The calculator tool on multi-step word problems (``data.name: gsm8k``): the model may call
    ``calc(expr)`` several times (``max_turns`` 6) and gives the final answer as ``\\boxed{n}``.
    Reward: 1.0 when the number in the final turn's last ``\\boxed{}`` equals the row's answer.
    Source: GSM8K (Cobbe et al. 2021, arXiv:2110.14168), whose solutions annotate each step's
    arithmetic as a calculator call."""

    name = "gsm8k_calculator"
    system, example, boxed = GSM8K_CALC_SYSTEM, [], True

    class Params(Calculator.Params):
        max_turns: int = Field(6, ge=1, description="turn budget: model turns per episode (>= 1)")
        max_total_tokens: int = Field(768, ge=1, description="token budget: model + environment tokens "
                                      "after the prompt (>= 1)")


COMPONENTS = (Calculator, GSM8KCalculator)
