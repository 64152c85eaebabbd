"""The python_sandbox env: model-written Python runs under bubblewrap; a memory bomb is contained and
comes back as a tool error (the other escapes: tests/security/); the episode runs tests and scores
them; and a 2-step training run drives it on the tiny model, with secrets planted around it."""

from __future__ import annotations

import json
import math
import os

import pytest
from _engine_helpers import metrics, run_train

from policyzoo.plugins.env import PythonSandbox, find_code

ROW = {"prompt": [{"role": "user", "content": "Write add(a, b)."}], "tests": "assert add(1, 2) == 3", "answer": "3"}


def block(code: str) -> str:
    return f"Here:\n```python\n{code}\n```"


@pytest.fixture(scope="module")
def env():
    return PythonSandbox(timeout_s=3.0, cpu_s=2, memory_mb=256, max_procs=16)


def test_a_passing_program_ends_the_episode_with_reward_1(env):
    ep = env.env(ROW)
    obs = ep.step(block("def add(a, b):\n    return a + b"), [])
    assert obs.done and obs.tool_call and not obs.tool_error and ep.reward() == 1.0


def test_a_failing_program_shows_its_error_and_scores_0(env):
    ep = env.env(ROW)
    obs = ep.step(block("def add(a, b):\n    return a - b"), [])
    text = obs.messages[0]["content"]
    assert not obs.done and obs.tool_error and obs.messages[0]["role"] == "tool"
    assert text.startswith("exit code 1") and "AssertionError" in text and ep.reward() == 0.0
    assert ep.step("Answer: done", []).done and ep.reward() == 0.0  # no code: the final answer


def test_a_program_answers_a_word_problem_by_printing():
    ep = PythonSandbox().env({"prompt": "12 apples, 5 eaten?", "answer": "7"})
    obs = ep.step(block("print(12 - 5)"), [])
    assert obs.messages[0]["content"].startswith("exit code 0\nstdout:\n7")
    ep.step("Answer: 7", [])
    assert ep.reward() == 1.0


def test_find_code():
    assert find_code("a\n```python\nx = 1\n```\nb") == "x = 1\n" and find_code("no code") is None
    assert find_code("```py\nprint(2)") == "print(2)"  # an unclosed block (the turn hit its token limit)


def test_escape_memory_bomb_is_contained(env):
    obs = env.env(ROW).step(block("x = bytearray(1 << 30)"), [])  # 1 GiB, over the 256 MiB limit
    assert obs.tool_error and "MemoryError" in obs.messages[0]["content"]


def test_engine_trains_two_steps_with_the_code_env(tmp_path):
    data = tmp_path / "funcs.jsonl"
    tasks = [("add(a, b) returning a + b", "assert add(1, 2) == 3"), ("neg(x) returning -x", "assert neg(4) == -4"),
             ("sq(x) returning x * x", "assert sq(3) == 9"), ("half(x) returning x / 2", "assert half(8) == 4"),
             ("inc(x) returning x + 1", "assert inc(1) == 2"), ("dbl(x) returning 2 * x", "assert dbl(2) == 4")]
    data.write_text("".join(json.dumps({"prompt": f"Write a Python function {t}.", "tests": a}) + "\n"
                            for t, a in tasks * 2))
    out = tmp_path / "run"
    secret = "pz-run-secret-" + os.urandom(6).hex()  # in the trainer's environment and a file in the run dir
    out.mkdir()
    (out / "planted.txt").write_text(secret)
    os.environ["HF_TOKEN"], os.environ["WANDB_API_KEY"] = secret, secret  # run_train copies os.environ
    try:
            proc = run_train(out, "train.steps=2", "algorithm.sample.n=2", f"data.path={data}", "data.eval_size=2",
                         "algorithm.env.use=python_sandbox", "algorithm.env.max_turns=2",
                         "algorithm.env.max_total_tokens=48", "algorithm.env.code_blocks=false", "rewards=null",
                         "eval.n=2", "eval.temperature=1.0", timeout=1500)
    finally:
        del os.environ["HF_TOKEN"], os.environ["WANDB_API_KEY"]
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert not any(secret in p.read_text(errors="replace") for p in out.rglob("*.jsonl"))  # nothing leaked out
    evals = metrics(out, "eval")  # 2 held-out prompts x 2 sampled episodes each, in the sandbox too
    assert [e["eval_n"] for e in evals] == [2, 2] and all(e["eval_pass@2"] == 0.0 for e in evals)
    assert all(e["eval_env_tool_call_frac"] == 1.0 for e in evals)
    train = [r for r in metrics(out) if r.get("kind") == "train"]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        assert math.isfinite(r["loss"]) and r["reward/env_reward"] == 0.0  # random bytes never pass a test
        assert r["env_tool_call_frac"] == 1.0  # code_blocks false: every turn ran in the sandbox
        assert r["env_tool_errors_mean"] >= 1.0  # ... and failed (a syntax error at least)
