"""The python_sandbox env: model-written Python runs under bubblewrap; escapes (network, writing
outside, fork bomb, infinite loop, memory bomb) are contained and come back as tool errors; the
episode runs tests and scores them; and a 2-step training run drives it on the tiny model."""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest
from _engine_helpers import BUILD, metrics, run_train

from policyzoo.plugins.env import PythonSandbox, find_code, run_python

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


class Listener:
    """A TCP server on the host's 127.0.0.1 that records connections."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port, self.accepted = self.sock.getsockname()[1], 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()


def test_escape_network_is_contained(env):
    srv = Listener()
    socket.create_connection(("127.0.0.1", srv.port), 2).close()  # reachable from the host
    deadline = time.monotonic() + 30  # the listener thread counts it when the (possibly loaded) machine lets it
    while srv.accepted < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.accepted == 1
    obs = env.env(ROW).step(block(f"import socket\nsocket.create_connection(('127.0.0.1', {srv.port}), 2)"), [])
    assert obs.tool_error and ("ConnectionRefusedError" in obs.messages[0]["content"]
                               or "Network is unreachable" in obs.messages[0]["content"])
    assert srv.accepted == 1  # the sandbox never got through
    srv.sock.close()


def test_escape_writing_outside_is_contained(env):
    # a host folder outside /tmp (the sandbox's own /tmp is a fresh tmpfs): the repository's .build,
    # unless the checkout itself lies under /tmp, then /var/tmp
    base = BUILD if not BUILD.resolve().is_relative_to("/tmp") else Path("/var/tmp")
    base.mkdir(exist_ok=True)
    folder = Path(tempfile.mkdtemp(dir=base))
    os.chmod(folder, 0o777)  # even a world-writable folder stays read-only inside
    target = folder / "pwned.txt"
    obs = env.env(ROW).step(block(f"open({str(target)!r}, 'w').write('x')"), [])
    assert obs.tool_error and "Read-only file system" in obs.messages[0]["content"] and not target.exists()
    shutil.rmtree(folder)
    r = run_python("open('/tmp/scratch', 'w').write('ok'); print(open('/tmp/scratch').read())")
    assert r.ok and r.stdout == "ok\n"  # the private /tmp is writable ...
    assert not os.path.exists("/tmp/scratch")  # ... and is not the host's


def test_escape_fork_bomb_is_contained(env):
    t0 = time.perf_counter()
    obs = env.env(ROW).step(block("import os\nwhile True:\n    os.fork()"), [])
    assert obs.tool_error and time.perf_counter() - t0 < 30
    assert "BlockingIOError" in obs.messages[0]["content"] or "timed out" in obs.messages[0]["content"]


def test_escape_infinite_loop_is_killed_at_the_limit(env):
    t0 = time.perf_counter()
    obs = env.env(ROW).step(block("while True:\n    pass"), [])
    took = time.perf_counter() - t0
    text = obs.messages[0]["content"]
    assert obs.tool_error and took < 25  # 2 CPU seconds or 3 s of wall clock, whichever first (not forever)
    assert text.startswith(("timed out after 3 s", "killed by signal"))  # wall clock, or RLIMIT_CPU's signal


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
    proc = run_train(out, "train.steps=2", "algorithm.sample.n=2", f"data.path={data}", "data.eval_size=2",
                     "algorithm.env.use=python_sandbox", "algorithm.env.max_turns=2",
                     "algorithm.env.max_total_tokens=48", "algorithm.env.code_blocks=false", "rewards=null",
                     "eval.n=2", "eval.temperature=1.0", timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    evals = metrics(out, "eval")  # 2 held-out prompts x 2 sampled episodes each, in the sandbox too
    assert [e["eval_n"] for e in evals] == [2, 2] and all(e["eval_pass@2"] == 0.0 for e in evals)
    assert all(e["eval_env_tool_call_frac"] == 1.0 for e in evals)
    train = [r for r in metrics(out) if r.get("kind") == "train"]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        assert math.isfinite(r["loss"]) and r["reward/env_reward"] == 0.0  # random bytes never pass a test
        assert r["env_tool_call_frac"] == 1.0  # code_blocks false: every turn ran in the sandbox
        assert r["env_tool_errors_mean"] >= 1.0  # ... and failed (a syntax error at least)
