"""A multi-turn verifiers environment with tools, for the tests: a ToolEnv whose tools add two
integers and echo a text; rubric: the final answer equals the row's answer."""

import verifiers as vf
from datasets import Dataset


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


def echo(text: str) -> str:
    """Repeat a text back (the tests pass special-token strings through it).

    Args:
        text: the text to repeat
    """
    return text


def load_environment(n: int = 6, max_turns: int = 3):
    rows = [{"question": f"Use the add tool: what is {i} + {2 * i}?", "answer": str(3 * i)} for i in range(n + 2)]
    parser = vf.Parser()

    def correct_answer(completion, answer, parser) -> float:
        return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0

    return vf.ToolEnv(dataset=Dataset.from_list(rows[:n]), eval_dataset=Dataset.from_list(rows[n:]),
                      system_prompt="Answer with the number only.", tools=[add, echo], max_turns=max_turns,
                      parser=parser, rubric=vf.Rubric(funcs=[correct_answer], parser=parser))
