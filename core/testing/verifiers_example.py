"""A small single-turn verifiers environment for the contract suite (``verifiers`` env's
``contract_params``): three arithmetic questions, one exact-answer reward function.
Source: none, a test fixture."""

from __future__ import annotations


def load_environment(n: int = 3):
    """``vf.SingleTurnEnv`` over ``n`` rows "What is i + 2?" (answer ``i + 2``), rubric: exact answer."""
    import verifiers as vf
    from datasets import Dataset

    rows = [{"question": f"What is {i} + 2?", "answer": str(i + 2)} for i in range(n)]

    def exact_answer(completion, answer, parser) -> float:
        return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0

    parser = vf.Parser()
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), system_prompt="Answer with the number only.",
                            parser=parser, rubric=vf.Rubric(funcs=[exact_answer], parser=parser))
