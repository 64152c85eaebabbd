"""TRL-style reward functions run unchanged through the `function` reward (and the Python API's
callables): TRL's keyword arguments, conversational data as message lists, one metric per function."""

import math
import re

import pytest
import torch

import policyzoo
from policyzoo.api import REWARDS, reward_entry
from policyzoo.contract import Rollout
from policyzoo.data import load_task
from policyzoo.errors import UserError
from policyzoo.plugins.reward import Function


# Two reward functions as TRL's GRPOTrainer documentation writes them (huggingface.co/docs/trl,
# "Using a custom reward function"), copied by hand: a conversational format check and a
# standard-format accuracy check against a `ground_truth` column.
def format_reward_func(completions, **kwargs):
    """Reward function that checks if the completion has a specific format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


def reward_func(completions, ground_truth, **kwargs):
    # Regular expression to capture content inside \boxed{}
    matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    # Reward 1 if the content is the same as the ground truth, 0 otherwise
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]


def rollout(completions, rows, prompts=None, ids=None):
    b = len(completions)
    ids = ids or [[5, 6, 7]] * b
    t = max(len(x) for x in ids)
    resp = torch.full((b, t), 2)
    mask = torch.zeros((b, t), dtype=torch.bool)
    for i, x in enumerate(ids):
        resp[i, :len(x)] = torch.tensor(x)
        mask[i, :len(x)] = True
    return Rollout(prompt_ids=[[1]] * b, response_ids=resp, response_mask=mask, rollout_logprobs=torch.zeros(b, t),
                   group_ids=torch.zeros(b, dtype=torch.long), truncated=torch.zeros(b, dtype=torch.bool),
                   prompts=prompts or ["<templated>"] * b, completions=completions, rows=rows)


def fn(callable_, i=0):
    return Function(function=reward_entry(callable_, i)["function"])


def test_trl_conversational_example_gets_message_lists():
    chat = [{"role": "user", "content": "Think, then answer."}]
    rows = [{"prompt": chat, "_raw_prompt": chat}] * 3
    texts = ["<think>a</think><answer>b</answer>", "no tags", "<think>x</think><answer>y</answer> trailing"]
    got = fn(format_reward_func).reward(rollout=rollout(texts, rows))
    assert got.tolist() == [1.0, 0.0, 0.0]  # only the first matches ^...$


def test_trl_standard_example_reads_a_dataset_column():
    rows = [{"prompt": [{"role": "user", "content": q}], "_raw_prompt": q, "ground_truth": gt}
            for q, gt in (("1+1?", "2"), ("2+2?", "4"), ("3+3?", "6"))]
    texts = ["so \\boxed{2}", "\\boxed{5}", "six"]
    assert fn(reward_func).reward(rollout=rollout(texts, rows)).tolist() == [1.0, 0.0, 0.0]


def test_trl_keyword_arguments():
    seen = {}

    def spy(prompts, completions, completion_ids, trainer_state, **kwargs):
        seen.update(prompts=prompts, completions=completions, ids=completion_ids, state=trainer_state, kw=kwargs)
        return [None, 0.5]

    rows = [{"prompt": [{"role": "user", "content": "hi"}], "_raw_prompt": "hi", "level": 1, "answer": "a"},
            {"prompt": [{"role": "user", "content": "yo"}], "_raw_prompt": "yo", "level": 2, "answer": "b"}]
    out = fn(spy).reward(rollout=rollout(["x", "yz"], rows, ids=[[9], [8, 2]]))
    assert math.isnan(out[0]) and out[1] == 0.5  # None -> NaN (unscorable)
    # plain-text data: the prompts as the data gives them, completions as strings
    assert seen["prompts"] == ["hi", "yo"] and seen["completions"] == ["x", "yz"]
    assert seen["ids"] == [[9], [8, 2]]  # the generated tokens, eos (2) included
    assert seen["kw"] == {"level": [1, 2], "answer": ["a", "b"]}  # columns; no prompt, no _raw_prompt
    assert (seen["state"].global_step, seen["state"].max_steps) == (0, 0)  # outside a run


def test_callables_are_registered_by_name_and_logged_under_it():
    entry = reward_entry(reward_func, 0)
    assert entry == {"use": "function", "function": "policyzoo.api:REWARDS.reward_func"}
    assert reward_entry(lambda completions, **kw: [0.0] * len(completions), 3)["function"].endswith("lambda_3")
    run = policyzoo.assemble("grpo", rewards=(policyzoo.use("function", function=entry["function"]),
                                              policyzoo.use("function", function=entry["function"]),
                                              policyzoo.use("answer_match")))
    assert run.reward_labels == ["reward_func", "reward_func_2", "answer_match"]


def test_a_callable_of_another_process_is_a_clear_error():
    with pytest.raises(UserError) as e:
        Function(function="policyzoo.api:REWARDS.never_registered_here")
    assert "only in that Python process" in e.value.why and "resume=RUN_DIR" in e.value.fix
    assert not hasattr(REWARDS, "__wrapped__")  # dunder look-ups (inspect, copy) stay AttributeErrors


def test_python_api_arguments_map_onto_the_config(tmp_path):
    from policyzoo.api import build_config

    c = build_config("dapo", model="/m", dataset=str(tmp_path / "d.jsonl"), rewards=[format_reward_func, "math_verify"],
                     output_dir=str(tmp_path / "run"), algorithm={"sample": {"n": 4}}, train={"lr": 2e-6},
                     **{"train.steps": 7, "data.eval_size": 0.1})
    assert c.algorithm == {"base": "dapo", "sample": {"n": 4}}  # the section merges into the named algorithm
    assert (c.model.path, c.data.path, c.output_dir) == ("/m", str(tmp_path / "d.jsonl"), str(tmp_path / "run"))
    assert (c.train.lr, c.train.steps, c.data.eval_size) == (2e-6, 7, 0.1)
    assert c.rewards == [{"use": "function", "function": "policyzoo.api:REWARDS.format_reward_func"}, "math_verify"]
    # an in-memory data set is saved into the run directory and data.path points there
    c = build_config(dataset=[{"prompt": "p", "answer": "1"}] * 3, output_dir=str(tmp_path / "run2"))
    assert c.data.path == str(tmp_path / "run2" / "dataset")
    assert load_task(c.data).train_rows[0]["answer"] == "1"
