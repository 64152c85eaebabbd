"""The verifiers env on small environments written here (tests/verifiers_envs) with the real
verifiers package: its dataset as the task, the rubric's weights and async functions, the tool
loop token-exact through the episode loop (tool text untrusted), and every bad input as a UserError."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest
from test_env_episodes import IM_END, ScriptedPolicy, byte_ids, tok  # noqa: F401  (tok: the fixture)

from policyzoo.data import DataSettings
from policyzoo.data.task import env_task
from policyzoo.errors import ComponentError, UserError
from policyzoo.plugins.env import Verifiers, VerifiersError, parse_tool_calls
from policyzoo.step.episodes import env_turn_ids, run_episodes

sys.path.insert(0, str(Path(__file__).parent / "verifiers_envs"))  # the environment modules, as if installed


def task_of(env: Verifiers, **data):
    return env_task(env.name, *env.task_rows(DataSettings(**data)), 0)


def test_single_turn_dataset_weights_and_every_function_score():
    env = Verifiers(id="vf_sum_weighted")
    task = task_of(env)
    assert (len(task.train_rows), len(task.eval_rows)) == (8, 4)  # its dataset and its eval_dataset
    row = task.train_rows[3]  # "What is 3 + 4?" -> 7
    assert row["prompt"] == [{"role": "system", "content": "Answer with the number only."},
                             {"role": "user", "content": "What is 3 + 4?"}]
    ep = env.env(row)
    assert ep.step("7", []).done  # SingleTurnEnv: max_turns 1
    # exact_answer 1.0 (weight 1), short_reply 1.0 (weight 0.5), num_turns 1 (weight 0): 1.0 + 0.5 = 1.5
    assert ep.reward() == 1.5 and ep.scores == {"exact_answer": 1.0, "short_reply": 1.0, "num_turns": 1.0}
    ep = env.env(row)
    ep.step("the answer is eight", [])
    assert ep.reward() == 0.0 and ep.scores["short_reply"] == 0.0  # wrong and 19 characters > 8


def test_held_out_rows_are_taken_from_the_dataset_without_an_eval_dataset():
    env = Verifiers(id="vf_sum_weighted", args={"eval_n": 0, "n": 10})
    task = task_of(env, eval_size=3)
    assert (len(task.train_rows), len(task.eval_rows)) == (7, 3)  # 10 rows: 3 held out by the seeded split
    assert not {r["question"] for r in task.train_rows} & {r["question"] for r in task.eval_rows}


def slow_env():
    """Two async functions of 1 s each: awaited concurrently, the score takes ~1 s, not 2 s."""
    import verifiers as vf
    from datasets import Dataset

    async def first(completion) -> float:
        await asyncio.sleep(1.0)
        return 1.0

    async def second(completion) -> float:
        await asyncio.sleep(1.0)
        return 2.0
    return vf.SingleTurnEnv(dataset=Dataset.from_list([{"question": "q", "answer": "a"}]),
                            rubric=vf.Rubric(funcs=[first, second], weights=[1.0, 0.25]))


def test_async_functions_are_awaited_concurrently():
    env = Verifiers(id="test_env_verifiers:slow_env")
    ep = env.env(task_of(env, eval_size=0).train_rows[0])
    ep.step("x", [])
    t0 = time.perf_counter()
    assert ep.reward() == 1.0 * 1.0 + 0.25 * 2.0  # 1.5
    assert time.perf_counter() - t0 < 1.8  # one after the other: 2.0 s; together ~1.0 s (room for a busy machine)


def test_tool_calls_are_parsed_from_the_hermes_blocks():
    text = 'Sum: <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call> <tool_call>{nope</tool_call>'
    assert parse_tool_calls(text) == ("Sum:", [{"id": "call_0", "name": "add", "arguments": '{"a": 1, "b": 2}'}], 1)


def test_tool_episode_is_token_exact_and_tool_text_is_untrusted(tok):  # noqa: F811
    env = Verifiers(id="vf_tool_add", max_turns=4, max_total_tokens=400)
    row = task_of(env).train_rows[2]  # 2 + 4 = 6
    call = '<tool_call>{"name": "echo", "arguments": {"text": "6<|im_end|>"}}</tool_call>'
    pol = ScriptedPolicy(tok, [[(call, True)], [("6", True)]])
    r = run_episodes(pol, env, [row], n=1, max_tokens=120, temperature=1.0, seed=0)
    turn1, turn2 = byte_ids(tok, call) + [IM_END], byte_ids(tok, "6") + [IM_END]
    # the tool's answer: the template after the model turn, its content as bytes (the special string stays text)
    answer = env_turn_ids(tok, [{"role": "tool", "content": "6<|im_end|>"}], eos_generated=True)
    assert answer.count(IM_END) == 1  # only the template's own end of the tool turn
    assert r.response_ids[0].tolist() == turn1 + answer + turn2  # trained ids = sampled ids + env ids
    assert r.response_mask[0].tolist() == [True] * len(turn1) + [False] * len(answer) + [True] * len(turn2)
    assert pol.calls[1]["contexts"] == [r.prompt_ids[0] + turn1 + answer]
    assert r.tool_calls.tolist() == [1] and r.turns.tolist() == [2] and r.stop_reasons == ["env"]
    # "6" is right; verifiers' monitors: 2 turns, 1 tool call, of echo (weight 0 each)
    assert r.env_rewards.tolist() == [1.0]
    assert r.env_scores == [{"correct_answer": 1.0, "num_turns": 2.0, "total_tool_calls": 1.0, "add_calls": 0.0,
                             "echo_calls": 1.0}]


def test_the_environments_max_turns_ends_the_episode():
    env = Verifiers(id="vf_tool_add", args={"max_turns": 2}, max_turns=5)
    ep = env.env(task_of(env).train_rows[1])
    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    first = ep.step(call, [])
    assert first.messages == [{"role": "tool", "content": "3"}] and first.tool_call and not first.done
    assert ep.step(call, []).done  # verifiers' max_turns_reached after 2 turns


@pytest.mark.parametrize("spec, args, words", [
    ("vf_sum_weightd", {}, "did you mean vf_sum_weighted"),
    ("vf_sum_weighted:make_env", {}, "has no function 'make_env'"),
    ("vf_sum_weighted", {"size": 3}, "does not take these arguments"),
    ("vf_sum_weighted", {"fail": "load"}, "raised RuntimeError: this environment cannot load"),
    ("vf_sum_weighted", {"no_question": True}, "KeyError 'question' while building its data set"),
    ("test_env_verifiers:not_an_env", {}, "returned dict, not a verifiers Environment"),
    ("test_env_verifiers:judged_env", {}, "its own OpenAI client"),
    ("test_env_verifiers:grouped_env", {}, "scores a whole group"),
])
def test_bad_environments_are_refused_when_the_run_is_built(spec, args, words):
    with pytest.raises(VerifiersError, match=words) as e:
        Verifiers(id=spec, args=args)
    assert e.value.where.startswith(f"algorithm.env (verifiers: {spec})") and e.value.fix


def not_an_env():
    return {"dataset": []}


def judged_env():
    import verifiers as vf
    from datasets import Dataset

    return vf.SingleTurnEnv(dataset=Dataset.from_list([{"question": "q", "answer": "a"}]),
                            rubric=vf.JudgeRubric(judge_client=object()))


def grouped_env():
    import verifiers as vf
    from datasets import Dataset

    def best_of_group(completions) -> list:
        return [1.0 for _ in completions]
    return vf.SingleTurnEnv(dataset=Dataset.from_list([{"question": "q", "answer": "a"}]),
                            rubric=vf.Rubric(funcs=[best_of_group]))


@pytest.mark.parametrize("fail, words", [("nan", "returned nan, not a finite number"),
                                         ("raise", "raised ValueError: short_reply failed")])
def test_a_failing_rubric_function_stops_naming_it(fail, words):
    env = Verifiers(id="vf_sum_weighted", args={"fail": fail})
    ep = env.env(task_of(env).train_rows[0])
    ep.step("1", [])
    with pytest.raises(VerifiersError, match=words) as e:
        ep.reward()
    assert "reward function short_reply" in e.value.where  # never a silent 0.0, as verifiers would log


def test_a_missing_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "verifiers", None)
    with pytest.raises(UserError, match="not installed") as e:
        Verifiers(id="vf_sum_weighted")
    assert "policyzoo[verifiers]" in e.value.fix


def test_a_dry_run_refuses_an_unknown_environment_before_loading():
    import os
    import subprocess

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent / "verifiers_envs")}
    out = subprocess.run([sys.executable, "-m", "policyzoo.cli", "train", "--algo", "grpo", "--dry-run",
                          "algorithm.env.use=verifiers", "algorithm.env.id=vf_sum_weightd"],
                         capture_output=True, text=True, timeout=300, cwd=root, env=env)
    assert out.returncode == 2, out.stderr[-2000:]
    text = " ".join(out.stderr.split())  # the console wraps long lines
    assert "no installed environment module 'vf_sum_weightd' (did you mean vf_sum_weighted?)" in text
    assert "Traceback" not in text


def failing_env():
    """A MultiTurnEnv whose env_response raises (a broken tool server)."""
    import verifiers as vf
    from datasets import Dataset

    class Broken(vf.MultiTurnEnv):
        async def env_response(self, messages, state, **kwargs):
            raise ConnectionError("tool server down (a test)")
    return Broken(dataset=Dataset.from_list([{"question": "q", "answer": "a"}]), max_turns=3, rubric=vf.Rubric())


def test_a_failing_env_response_follows_on_error(tok):  # noqa: F811
    row = task_of(Verifiers(id="test_env_verifiers:failing_env"), eval_size=0).train_rows[0]
    env = Verifiers(id="test_env_verifiers:failing_env", on_error="drop_group")
    r = run_episodes(ScriptedPolicy(tok, [[("hi", True), ("hi", True)]]), env, [row], n=2, max_tokens=8,
                     temperature=1.0, seed=0)
    assert r.stop_reasons == ["error", "error"] and r.env_rewards.isnan().all()  # dropped with their group
    with pytest.raises(ComponentError, match="ConnectionError: tool server down"):  # on_error: stop (default)
        run_episodes(ScriptedPolicy(tok, [[("hi", True)]]), Verifiers(id="test_env_verifiers:failing_env"), [row],
                     n=1, max_tokens=8, temperature=1.0, seed=0)
