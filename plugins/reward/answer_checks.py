"""Answer checks against the data row's ``answer``: strict numbers and math-verify."""

from __future__ import annotations

import torch
from pydantic import Field

from policyzoo.contract import Reward, hookimpl
from policyzoo.data.answers import extract_number
from policyzoo.errors import DataError, UserError


class AnswerMatch(Reward):
    """Strict numeric answer check, ``[B]`` float in {0.0, 1.0}.

    The completion's answer: with an "Answer:", "answer is" or "####" marker, the one number in the
    span after the last marker up to the end of its sentence or line; a span holding more than one
    number is no answer ("Answer: 42 or 43" scores 0.0 for gold 42: a hedge is not paid), nor one
    holding none. Without a marker, the completion's last number. ``row["answer"]`` is parsed the
    same way (so a GSM8K solution "... #### 72" works). 1.0 when both are equal as decimals ("72" =
    "72.0" = "72.00", "1,234" = "1234"), else 0.0 (also when the completion has no number). No
    tolerance, no fractions, no LaTeX: use the ``math_verify`` reward for those.
    Errors: ``DataError`` naming the row when it has no parsable ``answer``.
    Source: GSM8K's "#### answer" format (Cobbe et al. 2021, arXiv:2110.14168)."""

    name = "answer_match"
    needs_answer = True  # prompt-only data is refused before training
    binary = True  # 0/1 correctness: groups of one prompt are often constant (policyzoo.equivalence's regime)

    @hookimpl
    def reward(self, rollout):
        out = []
        for i, (row, text) in enumerate(zip(rollout.rows, rollout.completions)):
            if "answer" not in row:
                raise DataError(f"reward: answer_match, row {i}", f"the data row has no 'answer' column "
                                f"(columns: {', '.join(map(str, row)) or 'none'})",
                                "add an 'answer' column to the data set, or use another reward")
            gold = extract_number(str(row["answer"]))
            if gold is None:
                raise DataError(f"reward: answer_match, row {i}", f"answer {str(row['answer'])[:80]!r} "
                                "contains no number", "answer_match compares numbers; use math_verify "
                                "or a `function` reward for other answers")
            got = extract_number(text)
            out.append(1.0 if got is not None and got == gold else 0.0)
        if len(out) != len(rollout):
            raise DataError("reward: answer_match", f"{len(rollout)} rows but {len(rollout.rows)} data rows "
                            f"and {len(rollout.completions)} completions", "the sampler must fill rows and completions")
        return torch.tensor(out, dtype=torch.float32)


class MathVerify(Reward):
    """Symbolic answer check with the ``math-verify`` package, ``[B]`` float in {0.0, 1.0}.

    1.0 when ``verify(parse(row["answer"]), parse(completion))`` is True: math-verify extracts the
    completion's last boxed / LaTeX / plain expression and compares values symbolically ("42" =
    "\\boxed{42}" = "\\boxed{42.0}", "0.5" = "\\frac{1}{2}"); 0.0 otherwise, including a
    completion with no extractable answer (a wrong format counts as wrong, never as NaN).
    ``timeout`` bounds each parse/verify in seconds with ``signal.alarm``, which works only in the
    main thread; off the main thread the calls run without a time limit.
    Errors: ``UserError`` if the package is missing (at construction, before training);
    ``DataError`` naming the row when ``row["answer"]`` has no parsable answer.
    Source: Hugging Face Math-Verify (github.com/huggingface/Math-Verify), gold first in verify."""

    name = "math_verify"
    needs_answer = True
    binary = True  # 0/1 correctness (policyzoo.equivalence's regime)

    class Params(Reward.Params):
        timeout: int = Field(5, ge=1, description="seconds allowed per parse and per verify (main thread only)")

    def __init__(self, **params):
        super().__init__(**params)
        try:
            import math_verify
        except ImportError:
            raise UserError("reward: math_verify", "the math-verify package is not installed",
                            "pip install math-verify  (or: pip install 'policyzoo[data]')") from None
        self.mv = math_verify

    @hookimpl
    def reward(self, rollout):
        import threading

        t = self.params.timeout if threading.current_thread() is threading.main_thread() else None
        if not (len(rollout.rows) == len(rollout.completions) == len(rollout)):
            raise DataError("reward: math_verify", f"{len(rollout)} rows but {len(rollout.rows)} data rows and "
                            f"{len(rollout.completions)} completions", "the sampler must fill rows and completions")
        out = []
        for i, (row, text) in enumerate(zip(rollout.rows, rollout.completions)):
            gold = self.mv.parse(str(row.get("answer", "")), parsing_timeout=t)
            if not gold:
                raise DataError(f"reward: math_verify, row {i}", f"no parsable answer in the data row's 'answer' "
                                f"({str(row.get('answer'))[:80]!r})", "give every row an 'answer' math-verify can read")
            ok = self.mv.verify(gold, self.mv.parse(text, parsing_timeout=t), timeout_seconds=t)
            out.append(1.0 if ok else 0.0)
        return torch.tensor(out, dtype=torch.float32)
