"""A single-turn verifiers environment for the tests: sums of two numbers, a rubric of two weighted
reward functions (exact match, weight 1.0; an async length check, weight 0.5)."""

import asyncio

import verifiers as vf
from datasets import Dataset


def load_environment(n: int = 8, eval_n: int = 4, no_question: bool = False, fail: str = ""):
    if fail == "load":
        raise RuntimeError("this environment cannot load (a test)")
    rows = [{"question": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)} for i in range(n + eval_n)]
    if no_question:
        rows = [{"text": r["question"], "answer": r["answer"]} for r in rows]
    parser = vf.Parser()

    def exact_answer(completion, answer, parser) -> float:
        return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0

    async def short_reply(completion) -> float:
        await asyncio.sleep(0.05)
        if fail == "nan":
            return float("nan")
        if fail == "raise":
            raise ValueError("short_reply failed (a test)")
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        return 1.0 if len(text) <= 8 else 0.0

    rubric = vf.Rubric(funcs=[exact_answer, short_reply], weights=[1.0, 0.5], parser=parser)
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows[:n]), eval_dataset=Dataset.from_list(rows[n:]),
                            system_prompt="Answer with the number only.", parser=parser, rubric=rubric)
