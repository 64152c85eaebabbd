"""Remote rewards against a real HTTP server this test starts on 127.0.0.1 (the standard library's
``ThreadingHTTPServer``, answering like a served reward model): batching, concurrency limit,
retries, cache, and every failure -- unreachable, malformed reply, timeout, wrong length -- as a
clear error or the documented NaN fallback. The judges' parsing runs against the same kind of
server answering as an OpenAI chat endpoint; ``test_judge_vllm.py`` runs them against vLLM."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from policyzoo.contract import Rollout
from policyzoo.plugins.reward import GroupJudge, Judge, RemoteReward, RemoteRewardError
from policyzoo.step import dispatch


class Server:
    """A scoring server: ``reply(body) -> (status, text, delay_s)`` decides each answer; records
    the requests and the most requests in flight at once."""

    def __init__(self, reply):
        self.requests, self.inflight, self.most, self.lock = [], 0, 0, threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                with outer.lock:
                    outer.requests.append((self.path, body))
                    outer.inflight += 1
                    outer.most = max(outer.most, outer.inflight)
                status, text, delay = reply(body)
                time.sleep(delay)
                with outer.lock:
                    outer.inflight -= 1
                data = text.encode()
                try:
                    self.send_response(status)
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (timeout)
                    pass

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve():
    servers = []

    def start(reply):
        servers.append(Server(reply))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def lengths(body):  # a reward model that scores a completion by its length
    return 200, json.dumps({"rewards": [float(len(c)) for c in body["completions"]]}), 0.0


def rollout(completions, groups=None):
    b = len(completions)
    return Rollout(prompt_ids=[[1]] * b, response_ids=torch.full((b, 2), 5), response_mask=torch.ones(b, 2, dtype=bool),
                   rollout_logprobs=torch.zeros(b, 2), group_ids=torch.tensor(groups or [0] * b),
                   truncated=torch.zeros(b, dtype=torch.bool), prompts=["p"] * b, completions=completions,
                   rows=[{"prompt": [{"role": "user", "content": f"q{i}"}], "answer": str(i)} for i in range(b)])


def test_remote_reward_batches_rows_and_reads_the_rewards(serve):
    s = serve(lengths)
    comp = RemoteReward(url=s.url + "/score", batch_size=2)
    assert comp.reward(rollout=rollout(["a", "bb", "ccc"])).tolist() == [1.0, 2.0, 3.0]
    # 3 rows in batches of 2; the two requests run concurrently, so they may arrive in either order
    bodies = sorted((b for _, b in s.requests), key=lambda b: b["answers"])
    assert [b["completions"] for b in bodies] == [["a", "bb"], ["ccc"]]
    assert bodies[0]["answers"] == ["0", "1"] and bodies[0]["prompts"][0][0]["content"] == "q0"
    comp.reward(rollout=rollout(["a", "bb", "ccc"]))
    assert len(s.requests) == 2  # the same requests again: answered from the cache


def in_pairs(value: float):
    """A reply that comes only once a second request is in flight too (each waits for a partner up to
    60 s, then the barrier breaks and the answer is a 500): requests served one after the other fail."""
    pair = threading.Barrier(2)

    def reply(body):
        try:
            pair.wait(60)
        except threading.BrokenBarrierError:
            return 500, "alone", 0.0
        return 200, json.dumps({"rewards": [value] * len(body["completions"])}), 0.0

    return reply


def test_concurrency_is_limited(serve):
    s = serve(in_pairs(0.0))
    RemoteReward(url=s.url, batch_size=1, max_concurrency=2, cache_size=0).reward(rollout=rollout(list("abcdef")))
    assert len(s.requests) == 6 and s.most == 2


def test_a_server_error_is_retried(serve):
    calls = []

    def flaky(body):
        calls.append(1)
        return (503, "busy", 0.0) if len(calls) < 3 else lengths(body)

    s = serve(flaky)
    assert RemoteReward(url=s.url, retries=2).reward(rollout=rollout(["ab"])).tolist() == [2.0]
    assert len(calls) == 3  # 2 failures, then the answer


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_endpoint_is_a_clear_error_or_nan():
    url = f"http://127.0.0.1:{free_port()}/score"  # nothing listens there
    with pytest.raises(RemoteRewardError, match=r"(?s)cannot connect.*2 attempts.*start the server"):
        RemoteReward(url=url, retries=1).reward(rollout=rollout(["a"]))
    with pytest.warns(UserWarning, match="2 rows unscorable"):
        got = RemoteReward(url=url, retries=0, on_failure="nan").reward(rollout=rollout(["a", "b"]))
    assert all(math.isnan(v) for v in got.tolist())


def test_malformed_and_wrong_length_replies(serve):
    s = serve(lambda body: (200, "<html>oops</html>", 0.0))
    with pytest.raises(RemoteRewardError, match="not JSON"):
        RemoteReward(url=s.url).reward(rollout=rollout(["a"]))
    s = serve(lambda body: (200, json.dumps({"rewards": [1.0]}), 0.0))
    with pytest.raises(RemoteRewardError, match=r"rows 0\.\.1: expected \{'rewards': \[2 numbers\]\}"):
        RemoteReward(url=s.url).reward(rollout=rollout(["a", "b"]))
    s = serve(lambda body: (404, "no such route", 0.0))
    with pytest.raises(RemoteRewardError, match="HTTP 404"):
        RemoteReward(url=s.url, retries=3).reward(rollout=rollout(["a"]))
    assert len(s.requests) == 1  # a 4xx is not retried


def test_a_slow_server_times_out(serve):
    s = serve(lambda body: (200, json.dumps({"rewards": [1.0]}), 30.0))
    t0 = time.perf_counter()
    with pytest.raises(RemoteRewardError, match=r"no reply within timeout = 0.3 s \(1 attempts\)"):
        RemoteReward(url=s.url, timeout=0.3, retries=0).reward(rollout=rollout(["a"]))
    assert time.perf_counter() - t0 < 20  # gave up, did not wait for the 30 s reply


def chat(content):
    return 200, json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}), 0.0


def test_judge_fills_the_template_and_parses_the_last_score(serve):
    s = serve(lambda body: chat(f"Thinking 3 then Score: {len(body['messages'][-1]['content']) % 7}"))
    comp = Judge(base_url=s.url + "/v1", model="judge", template="Q={prompt} A={answer} R={completion}")
    got = comp.reward(rollout=rollout(["x", "yy"]))
    # "Q=q0 A=0 R=x" has 12 characters -> 12 % 7 = 5 -> 0.5; "Q=q1 A=1 R=yy" 13 -> 6 -> 0.6
    assert got.tolist() == pytest.approx([0.5, 0.6])
    path, body = s.requests[0]
    assert path == "/v1/chat/completions" and body["model"] == "judge" and body["temperature"] == 0.0
    bad = serve(lambda body: chat("I cannot rate this."))
    with pytest.raises(RemoteRewardError, match="no score matching"):
        Judge(base_url=bad.url + "/v1", model="judge").reward(rollout=rollout(["x"]))
    with pytest.warns(UserWarning, match="1 rows unscorable"):
        assert math.isnan(Judge(base_url=bad.url + "/v1", model="judge", on_failure="nan").reward(
            rollout=rollout(["x"]))[0])


def test_group_judge_scores_each_group_in_one_request(serve):
    def rank(body):
        text = body["messages"][-1]["content"]
        n = text.count("Response ")
        return chat("\n".join(f"{k}: {2 * k}" for k in range(1, n + 1)))  # response k gets 2k

    s = serve(rank)
    got = GroupJudge(base_url=s.url + "/v1", model="judge").reward(rollout=rollout(["a", "b", "c", "d", "e"],
                                                                                  groups=[0, 0, 0, 1, 1]))
    assert got.tolist() == pytest.approx([0.2, 0.4, 0.6, 0.2, 0.4]) and len(s.requests) == 2
    short = serve(lambda body: chat("1: 5"))  # a reply that misses response 2
    with pytest.raises(RemoteRewardError, match=r"no score for responses \[2\]"):
        GroupJudge(base_url=short.url + "/v1", model="judge").reward(rollout=rollout(["a", "b"], groups=[0, 0]))


def test_remote_components_run_concurrently_in_the_step(serve):
    import policyzoo

    s = serve(in_pairs(1.0))  # the two components' requests answer only when both are in flight
    run = policyzoo.assemble("grpo", rewards=tuple(policyzoo.use("remote_reward", url=s.url + f"/{k}", cache_size=0,
                                                                 retries=0) for k in range(2)))
    out = dispatch.call_each(run, "reward", rows=1, rollout=rollout(["a"]))
    assert [v.tolist() for _, v in out] == [[1.0], [1.0]]  # both answered: the two requests were in flight at once
