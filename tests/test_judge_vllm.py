"""The LLM judges against a real OpenAI-compatible server: vLLM's own API server
(``python -m vllm.entrypoints.openai.api_server``) serving the tiny model on 127.0.0.1, started
and stopped by this module. The tiny model writes random bytes, so the judge's reply is pinned with
vLLM's structured outputs (``extra_body``), exercising request, reply and parser end to end; then
a 2-step training run scores with ``llm_judge`` against the same server."""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
import torch
from _engine_helpers import engine_env, metrics, run_train, tiny_model

from policyzoo.contract import Rollout
from policyzoo.plugins.reward import GroupJudge, Judge, RemoteRewardError

pytestmark = pytest.mark.engine_group  # starts vLLM's OpenAI server: make test-engine


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    env = {**engine_env(), "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model()),
           "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--enforce-eager", "--max-model-len", "1024", "--no-enable-chunked-prefill"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.time() + 1200  # a shared 2-core machine: vLLM's start-up takes minutes
    try:
        while True:
            assert proc.poll() is None, f"vLLM server exited {proc.returncode}: {log.read_text()[-3000:]}"
            assert time.time() < deadline, f"vLLM server not ready: {log.read_text()[-3000:]}"
            try:
                if httpx.get(url + "/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(2)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def rollout(completions, groups):
    b = len(completions)
    return Rollout(prompt_ids=[[1]] * b, response_ids=torch.full((b, 2), 5), response_mask=torch.ones(b, 2, dtype=bool),
                   rollout_logprobs=torch.zeros(b, 2), group_ids=torch.tensor(groups),
                   truncated=torch.zeros(b, dtype=torch.bool), prompts=["p"] * b, completions=completions,
                   rows=[{"prompt": "What is 2 + 2?", "answer": "4"}] * b)


def test_llm_judge_scores_through_vllm(server):
    comp = Judge(base_url=server, model="tiny", max_tokens=8, score_pattern=r"Score: (\d)",
                 extra_body={"structured_outputs": {"choice": ["Score: 7"]}})
    assert comp.reward(rollout=rollout(["4", "5"], [0, 0])).tolist() == pytest.approx([0.7, 0.7])
    assert comp.endpoint.requests == 2
    comp.reward(rollout=rollout(["4", "5"], [0, 0]))
    assert comp.endpoint.requests == 2  # the same requests: from the cache


def test_group_judge_scores_a_group_through_vllm(server):
    comp = GroupJudge(base_url=server, model="tiny", max_tokens=16,
                      extra_body={"structured_outputs": {"choice": ["1: 2\n2: 9"]}})
    assert comp.reward(rollout=rollout(["a", "b"], [0, 0])).tolist() == pytest.approx([0.2, 0.9])


def test_unparsable_judge_replies_are_an_error_or_nan(server):
    kw = dict(base_url=server, model="tiny", max_tokens=4, extra_body={"structured_outputs": {"choice": ["none"]}})
    with pytest.raises(RemoteRewardError, match="no score matching"):
        Judge(**kw).reward(rollout=rollout(["a"], [0]))
    with pytest.warns(UserWarning, match="1 rows unscorable"):
        assert math.isnan(Judge(on_failure="nan", **kw).reward(rollout=rollout(["a"], [0]))[0])
    with pytest.raises(RemoteRewardError, match="HTTP 404"):  # a model the server does not serve
        Judge(base_url=server, model="nope").reward(rollout=rollout(["a"], [0]))


def test_engine_trains_two_steps_with_the_judge(server, tmp_path):
    judge = (f'rewards=[{{use: llm_judge, base_url: "{server}", model: tiny, max_tokens: 8, '
             'extra_body: {structured_outputs: {choice: ["Score: 3", "Score: 8"]}}}]')
    out = tmp_path / "run"
    proc = run_train(out, "train.steps=2", "algorithm.sample.n=2", judge, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    train = [r for r in metrics(out) if r.get("kind") == "train"]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        assert math.isfinite(r["loss"]) and 0.3 - 1e-6 <= r["reward/llm_judge"] <= 0.8 + 1e-6  # each row 3/10 or 8/10
