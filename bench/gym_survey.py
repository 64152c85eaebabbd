"""Greedy base rate of the default model on reasoning-gym tasks, to pick the task of `make demo-gym`.

    .venv/bin/python bench/gym_survey.py letter_counting,gcd,count_bits 32 [two|zero]

For each task: 32 items from seed 10000, reasoning-gym's default system prompt, and either two
solved examples from seed 20000 as chat turns answered ``<answer>ANSWER</answer>`` (``two``, what
``data.few_shot=2`` does) or none (``zero``); greedy, 24 new tokens; the task's own
``score_answer`` on ``extract_answer``. Prints one JSON line per task: the mean score and the share
of completions holding an ``<answer>`` tag. Results: bench/results/gym_demo/.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("POLICYZOO_CACHE", os.path.join(os.path.dirname(__file__), "..", ".build", "cache"))


def chat(question: str, system: str, shots: list[dict]) -> list[dict]:
    turns = [{"role": "system", "content": system}]
    for x in shots:
        turns += [{"role": "user", "content": x["question"]},
                  {"role": "assistant", "content": f"<answer>{x['answer']}</answer>"}]
    return turns + [{"role": "user", "content": question}]


def main() -> None:
    import reasoning_gym as rg
    from reasoning_gym.utils import SYSTEM_PROMPTS, extract_answer
    from vllm import LLM, SamplingParams

    from policyzoo.engine.models import default_model_path
    from policyzoo.engine.process import setup_process

    setup_process()
    tasks, n = sys.argv[1].split(","), int(sys.argv[2]) if len(sys.argv) > 2 else 32
    k = 0 if (sys.argv[3] if len(sys.argv) > 3 else "two") == "zero" else 2
    llm = LLM(str(default_model_path()), dtype="float32", seed=0, max_model_len=1024, enforce_eager=True,
              distributed_executor_backend="uni", enable_chunked_prefill=False)
    tok = llm.get_tokenizer()
    for task in tasks:
        ds = rg.create_dataset(task, seed=10_000, size=n)
        shots = list(rg.create_dataset(task, seed=20_000, size=k)) if k else []
        prompts = [tok.apply_chat_template(chat(e["question"], SYSTEM_PROMPTS["default"], shots), tokenize=False,
                                           add_generation_prompt=True) for e in ds]
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)
        texts = [o.outputs[0].text for o in outs]
        scores = [float(ds.score_answer(extract_answer(t), e)) for t, e in zip(texts, ds)]
        print(json.dumps({"task": task, "examples": k, "n": n, "greedy": sum(scores) / n,
                          "tagged": sum(extract_answer(t) is not None for t in texts) / n, "example": texts[0][:120]}),
              flush=True)


if __name__ == "__main__":
    main()
