"""Reward functions get their own copies of what they are given: one that edits its arguments in
place (prompt messages, completions, completion ids, a column's lists, ``trainer_state``) changes
neither the data set's rows, nor the next reward's inputs, nor what the run logs.

The step runs on the bandit test bed (``policyzoo.testing.bandit``) with chat rows held in a
module-level list, drawn as the engine draws them (``rows_at``: shallow copies of the rows, the
G samples of a prompt sharing one copy), so a row's ``prompt`` list is the data set's own object,
exactly as in a real run."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from policyzoo import use
from policyzoo.api import reward_entry
from policyzoo.assembly import assemble
from policyzoo.contract import Rollout
from policyzoo.data.batching import rows_at
from policyzoo.engine.report.tracking import completion_rows
from policyzoo.plugins.reward.function import Function, RewardFunctionError
from policyzoo.step import train_step
from policyzoo.testing.bandit import Bandit, bandit_catalog, step_settings


def chat(q: int) -> list[dict]:
    """The prompt of question ``q``, built afresh on every call (so expectations never alias the data)."""
    return [{"role": "system", "content": "Pick one."}, {"role": "user", "content": f"question {q}"}]


def data() -> list[dict]:
    # two chat rows (``_raw_prompt`` a message list: the function reward passes message lists),
    # each with a list column ``tags`` and the bandit's own ``scores`` (1 candidate, score 1.0)
    return [{"prompt": chat(q), "_raw_prompt": chat(q)[1:], "question": q, "scores": [1.0], "tags": ["t"]}
            for q in range(2)]


def render(messages: list[dict]) -> str:
    return "".join(f"<{m['role']}>{m['content']}" for m in messages)


class ChatBandit(Bandit):
    """The bandit, with ``rollout.prompts`` as rendered text (the engine's are the decoded prompt ids)."""

    def generate(self, prompts, n, max_tokens, temperature, seed):
        r = super().generate(prompts, n, max_tokens, temperature, seed)
        return dataclasses.replace(r, prompts=[render(p["prompt"]) for p in prompts for _ in range(n)])


SEEN: dict[str, dict] = {}


def mutate(prompts, completions, completion_ids, trainer_state, **columns):
    """Records its inputs as they arrive, then edits every one of them in place."""
    SEEN["mutate"] = copy.deepcopy(dict(prompts=prompts, completions=completions, completion_ids=completion_ids,
                                        global_step=trainer_state.global_step, **columns))
    for p, c, ids, tags, scores in zip(prompts, completions, completion_ids, columns["tags"], columns["scores"]):
        p[0]["content"] = "edited"
        p.append({"role": "assistant", "content": "hijack"})
        c[0]["content"] = "edited"
        c.append({"role": "user", "content": "more"})
        ids.append(99)
        tags.append("edited")
        scores[0] = -5.0  # the bandit_correct reward after this one reads the row's scores
    trainer_state.global_step = 99
    SEEN["mutate_after"] = {"prompt_lengths": [len(p) for p in prompts]}
    return [0.0] * len(completions)


def spy(prompts, completions, completion_ids, trainer_state, **columns):
    SEEN["spy"] = copy.deepcopy(dict(prompts=prompts, completions=completions, completion_ids=completion_ids,
                                     global_step=trainer_state.global_step, **columns))
    return [0.0] * len(completions)


def test_a_reward_that_edits_its_inputs_changes_nothing_outside_its_call():
    SEEN.clear()
    rows = data()
    before = copy.deepcopy(rows)
    run = assemble("grpo", rewards=(use("function", function=reward_entry(mutate, 0)["function"]),
                                    use("function", function=reward_entry(spy, 1)["function"]),
                                    use("bandit_correct")), catalog=bandit_catalog())
    # 2 questions with one candidate each, 2 and 3 tokens long: every sample is "answer 0" with
    # ids [0, 1] or [0, 1, 1] (the choice k = 0, then the filler id K = 1), never truncated
    policy = ChatBandit([[2], [3]], scores=[[1.0], [1.0]], seed=0)
    batches = []
    m = train_step(run, policy, lambda: rows_at(rows, 0, 0, 2), seed=0, settings=step_settings(run),
                   on_batch=batches.append)
    r = batches[0].rollout
    qs = [row["question"] for row in r.rows]
    b = len(qs)
    assert b == 2 * run.sample.params.n and sorted(set(qs)) == [0, 1]
    # the data set's rows are as they were
    assert rows == before
    # the second reward saw what the first one saw before its edits, and both saw the data
    expected = dict(prompts=[chat(q) for q in qs], completions=[[{"role": "assistant", "content": "answer 0"}]] * b,
                    completion_ids=[[0, 1] if q == 0 else [0, 1, 1] for q in qs], global_step=0,
                    question=qs, scores=[[1.0]] * b, tags=[["t"]] * b)
    assert SEEN["mutate"] == expected
    assert SEEN["spy"] == expected
    # each row had its own prompt list: one message appended to each (shared lists would hold 2 + n)
    assert SEEN["mutate_after"]["prompt_lengths"] == [3] * b
    # bandit_correct read the rows' own scores (1.0), not the -5.0 the first reward wrote
    assert m["reward/bandit_correct"] == 1.0 and m["reward/mutate"] == 0.0
    # the logged completions: the rendered prompts and the sampled completions, unedited
    logged = completion_rows(batches[0], run.reward_labels)
    assert [x["completion"] for x in logged] == ["answer 0"] * b
    assert [x["prompt"] for x in logged] == [f"<system>Pick one.<user>question {q}" for q in qs]
    assert [x["reward/bandit_correct"] for x in logged] == [1.0] * b


def mutate_then_fail(prompts, completions, **columns):
    """Appends to every prompt, then raises for a batch that holds row 'boom' -- or for any prompt
    that is not the data's 2 messages, which only an earlier call's edit can cause."""
    for p in prompts:
        p.append({"role": "user", "content": "again"})
    if any(len(p) != 3 for p in prompts) or any("boom" in t for t in columns["tags"]):
        raise ValueError("bad row")
    return [1.0] * len(prompts)


def test_the_row_by_row_search_of_a_raising_reward_sees_the_data_as_it_is():
    rows = [{"prompt": chat(q), "_raw_prompt": chat(q)[1:], "tags": ["boom"] if q == 1 else ["t"]} for q in range(3)]
    before = copy.deepcopy(rows)
    b = len(rows)
    r = Rollout(prompt_ids=[[1]] * b, response_ids=torch.tensor([[5]] * b), response_mask=torch.ones(b, 1, dtype=bool),
                rollout_logprobs=torch.zeros(b, 1), group_ids=torch.arange(b), truncated=torch.zeros(b, dtype=bool),
                prompts=[render(x["prompt"]) for x in rows], completions=["x"] * b, rows=rows)
    with pytest.raises(RewardFunctionError) as e:
        Function(function=reward_entry(mutate_then_fail, 0)["function"]).reward(rollout=r)
    # the batch call appended to its copies and raised; the re-runs, one row each, start from the
    # data again: row 0 passes (3 messages after its own append), row 1 ('boom') is the first to fail
    assert "on row 1 (prompt 'question 1')" in e.value.why
    assert rows == before
