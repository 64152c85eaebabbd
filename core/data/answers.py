"""Reference answers: number normalisation and the GSM8K final-answer format.

Conventions (tested in ``tests/test_data_gsm8k.py``, ``tests/test_data_files.py`` and
``tests/test_math_reward_filter_sample.py``):

* A numeric answer is written ``[+-]digits[.digits]``; thousands separators (``1,000``) are
  removed and a leading ``+`` dropped. Nothing else is rewritten: ``3.50`` stays ``3.50`` (reward
  components compare numbers by value, not by string). Units, ``$`` and words are not numbers.
* JSON numbers are accepted: an integral float (``5.0``) becomes ``"5"``; bools are not numbers.
* GSM8K (Cobbe et al. 2021, arXiv:2110.14168) ends each solution with ``#### <answer>``; the
  reference answer is the text after the last ``####``, normalised as above.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[+-]?\.\d+")
_CALC = re.compile(r"<<[^<>]*>>")


def normalize_number(value) -> str | None:
    """``value`` (str, int or float) as a normalised number string, or None if it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return str(int(value)) if value.is_integer() else repr(value)
    if not isinstance(value, str):
        return None
    text = value.strip()
    if not _NUMBER.fullmatch(text):
        return None
    return text.replace(",", "").lstrip("+")


def gsm8k_final_answer(solution: str) -> str | None:
    """The normalised number after the last ``####`` of a GSM8K solution, or None."""
    if "####" not in solution:
        return None
    return normalize_number(solution.rsplit("####", 1)[1])


def gsm8k_worked_solution(solution: str, answer: str) -> str:
    """A GSM8K solution as a model should write it: calculator marks ``<<48/2=24>>`` removed and
    the ``#### 72`` line replaced by ``The answer is \\boxed{72}.`` (the form math-verify reads)."""
    body = _CALC.sub("", solution.rsplit("####", 1)[0]).strip()
    return f"{body}\nThe answer is \\boxed{{{answer}}}."


# The number a completion gives as its answer (used by the answer_match reward).
_IN_TEXT = r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+"
_MARKER = re.compile(r"answer\s*:|answer\s+is\b|####", re.IGNORECASE)
_SPAN_END = re.compile(r"\n|\.(?=\s|$)")  # a line break, or a full stop (not a decimal point)
_ANY = re.compile(_IN_TEXT)


def answer_span(text: str) -> str | None:
    """The text after the last "Answer:" / "answer is" / "####" marker up to the end of its line
    or sentence (a "." followed by a space or the end), or None when there is no marker."""
    marks = list(_MARKER.finditer(text))
    if not marks:
        return None
    rest = text[marks[-1].end():]
    return _SPAN_END.split(rest, maxsplit=1)[0]


def extract_number(text: str) -> Decimal | None:
    """The completion's answer as a number, or None. With a marker (:func:`answer_span`) the span
    must hold exactly one number: "Answer: 42 or 43" and "Answer: 42, maybe 43" are no answer (a
    hedge earns nothing), "Answer: I don't know" neither. Without a marker, the last number of
    ``text``. Commas only as thousands separators ("1,234" = 1234; "3,4" is two numbers); a
    trailing "." is a full stop."""
    span = answer_span(text)
    numbers = _ANY.findall(text if span is None else span)
    if not numbers or (span is not None and len(numbers) > 1):
        return None
    try:
        return Decimal(numbers[-1].replace(",", "").rstrip("."))
    except InvalidOperation:
        return None
