"""Tensor-parallel rollout bookkeeping (``policyzoo.engine.rollout.tensor_parallel``) with a fake vLLM.

A group's ranks send their requests to each other, submit them together as one ``LLM.generate``
call and each keeps its own request's outputs. Pinned here without a model: the one call holds the
group's prompts in rank order, each prompt with the seed of its global index; every rank gets
exactly its own prompts' responses, equal to what its own call would have sampled; held-out
evaluation's other ranks take part with empty requests; and the refusals before any model loads.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from policyzoo.config_sections import EngineSettings
from policyzoo.engine.rollout.tensor_parallel import (
    GroupRollout,
    check_tensor_parallel,
    follow_evaluation,
    group_of,
    run_requests,
    tp_groups,
)
from policyzoo.engine.rollout.vllm_engine import VLLMRollout
from policyzoo.errors import ConfigError


class FakeShard(torch.nn.Module):
    """A model shard: a norm of 5, an embedding 3 x 4 tied to the head (counted once), and a linear
    layer of 6 x 2 whose weight vLLM-CPU moved into its GEMM handler (an empty tensor left)."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.Parameter(torch.zeros(5))
        self.embed = torch.nn.Embedding(3, 4)
        self.embed.input_size_per_partition, self.embed.output_size_per_partition = 4, 3  # as vLLM's
        self.head = torch.nn.Module()
        self.head.weight = self.embed.weight
        self.head.input_size_per_partition, self.head.output_size_per_partition = 4, 3
        self.linear = torch.nn.Module()
        self.linear.weight = torch.nn.Parameter(torch.empty(0))
        self.linear.input_size_per_partition, self.linear.output_size_per_partition = 6, 2


class FakeLLM:
    """``generate`` answers every prompt deterministically from its token ids, its request's seed and
    the sample index (as seeded vLLM sampling does), and records each call."""

    def __init__(self):
        self.calls = []
        self.worker = SimpleNamespace(model_runner=SimpleNamespace(model=FakeShard()))

    def collective_rpc(self, fn):
        return [fn(self.worker)]

    def generate(self, prompts, params, use_tqdm=False):
        params = params if isinstance(params, list) else [params] * len(prompts)
        self.calls.append(([p["prompt_token_ids"] for p in prompts], params))
        outs = []
        for p, sp in zip(prompts, params):
            base = sum(p["prompt_token_ids"]) + (sp.seed or 0)
            samples = []
            for j in range(sp.n):
                toks = [(base + j + t) % 50 + 3 for t in range(3)]
                samples.append(SimpleNamespace(index=j, token_ids=toks, text=f"r{toks[0]}", finish_reason="length",
                                               logprobs=[{t: SimpleNamespace(logprob=-0.25 * t)} for t in toks]))
            outs.append(SimpleNamespace(outputs=samples[::-1]))  # vLLM does not promise the samples' order
        return outs


def fake_engine() -> VLLMRollout:
    eng = object.__new__(VLLMRollout)  # the real request building and packing, no vLLM started
    eng.info = SimpleNamespace(eos_token_ids=[2], pad_token_id=2, undecodable_ids=())
    eng.tokenizer = SimpleNamespace(decode=lambda ids, skip_special_tokens=True: f"r{ids[0]}" if ids else "")
    eng.llm = FakeLLM()
    eng.sleeper = SimpleNamespace(for_sampling=lambda: None)
    eng.encode = lambda rows: ([r["ids"] for r in rows], [r["prompt"] for r in rows])
    return eng


class FakeGroup:
    """Rank ``position`` of a group whose other ranks sent ``others`` (position -> request)."""

    def __init__(self, position: int, others: dict, index: int = 0):
        self.position, self.others, self.index, self.sent = position, others, index, []
        self.k = len(others) + 1

    def gather(self, obj):
        self.sent.append(obj)
        return [obj if r == self.position else self.others[r] for r in range(len(self.others) + 1)]


ROWS_0 = [{"prompt": "a", "ids": [5, 6]}]  # rank 0's share: global prompt 0
ROWS_1 = [{"prompt": "b", "ids": [7]}]  # rank 1's share: global prompt 1
ARGS = dict(n=2, max_tokens=3, temperature=1.0, seed=7)


def sample_request(rows, first_index):
    return {"kind": "sample", "rows": rows, "args": dict(ARGS, first_index=first_index)}


def test_groups_are_consecutive_ranks():
    assert tp_groups(4, 2) == [[0, 1], [2, 3]]
    assert tp_groups(2, 2) == [[0, 1]]
    assert [group_of(r, 2) for r in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_one_call_holds_the_group_prompts_in_rank_order_with_their_global_seeds():
    eng = fake_engine()
    out = run_requests(eng, [sample_request(ROWS_0, 0), sample_request(ROWS_1, 1)])
    assert len(eng.llm.calls) == 1
    prompts, params = eng.llm.calls[0]
    assert prompts == [[5, 6], [7]]
    # request_seed(7, k, 2) = (7 * 1_000_003 + k) * 2: 14_000_042 for global prompt 0, 14_000_044 for 1
    assert [p.seed for p in params] == [14_000_042, 14_000_044]
    assert [p.n for p in params] == [2, 2]
    # each request gets its own prompt's two samples, in sample order, with its global group id
    assert out[0].group_ids.tolist() == [0, 0] and out[1].group_ids.tolist() == [1, 1]
    # fake tokens: (sum(prompt) + seed + j + t) % 50 + 3; 5 + 6 + 14_000_042 = 14_000_053 = 50 * 280_001 + 3,
    # so sample j of prompt 0 starts at 3 + j + 3 = 6 + j; prompt 1: 7 + 14_000_044 = 14_000_051 -> 1 + 3 = 4
    assert out[0].response_ids[:, 0].tolist() == [6, 7]
    assert out[1].response_ids[:, 0].tolist() == [4, 5]
    assert out[1].prompt_ids == [[7], [7]] and out[1].rows == ROWS_1 * 2


def test_each_rank_keeps_what_its_own_call_and_the_whole_batch_call_would_sample():
    alone = [fake_engine().generate(ROWS_0, **ARGS, first_index=0), fake_engine().generate(ROWS_1, **ARGS,
                                                                                          first_index=1)]
    whole = fake_engine().generate(ROWS_0 + ROWS_1, **ARGS, first_index=0)  # one rank with the whole batch
    requests = {0: sample_request(ROWS_0, 0), 1: sample_request(ROWS_1, 1)}
    for pos, rows in ((0, ROWS_0), (1, ROWS_1)):
        eng = fake_engine()
        group = FakeGroup(pos, {r: q for r, q in requests.items() if r != pos})
        mine = GroupRollout(eng, group).generate(rows, **ARGS, first_index=pos)
        assert group.sent == [requests[pos]]
        for ref in (alone[pos], whole.select(whole.group_ids == pos)):
            assert torch.equal(mine.response_ids, ref.response_ids)
            assert torch.equal(mine.rollout_logprobs, ref.rollout_logprobs)
            assert torch.equal(mine.group_ids, ref.group_ids)
            assert mine.completions == ref.completions and mine.prompt_ids == ref.prompt_ids


def test_the_shard_size_is_reported():
    rollout = GroupRollout(fake_engine(), FakeGroup(0, {1: None}))
    assert rollout.shard_params == 5 + 3 * 4 + 6 * 2  # 29
    assert rollout.notes() == ["vLLM tensor parallel: groups of 2 ranks share one engine; this rank's shard holds "
                               "29 parameters"]


def test_greedy_requests_and_empty_requests():
    eng = fake_engine()
    greedy = {"kind": "greedy", "rows": ROWS_0 + ROWS_1, "max_tokens": 3}
    out = run_requests(eng, [greedy, {"kind": "greedy", "rows": [], "max_tokens": 3}])
    assert out[1] is None  # a rank that only takes part gets nothing back
    assert eng.llm.calls[0][0] == [[5, 6], [7]] and all(p.temperature == 0.0 for p in eng.llm.calls[0][1])
    assert len(out[0]) == 2 and out[0].group_ids.tolist() == [0, 1]
    assert run_requests(fake_engine(), [{"kind": "greedy", "rows": [], "max_tokens": 3}]) == [None]


def test_evaluation_is_followed_by_the_other_ranks_of_rank_0s_group_only():
    rank0_eval = {"kind": "greedy", "rows": ROWS_0, "max_tokens": 3}
    follower = GroupRollout(fake_engine(), FakeGroup(1, {0: rank0_eval}, index=0))
    follow_evaluation(follower, True, n=1, max_tokens=3, temperature=0.0, seed=7)
    assert follower.group.sent == [{"kind": "greedy", "rows": [], "max_tokens": 3}]
    assert follower.engine.llm.calls[0][0] == [[5, 6]]  # rank 0's rows, sampled on every rank of the group
    sampled = GroupRollout(fake_engine(), FakeGroup(1, {0: sample_request(ROWS_0, 0)}, index=0))
    follow_evaluation(sampled, True, n=2, max_tokens=3, temperature=1.0, seed=7)
    assert sampled.group.sent[0]["kind"] == "sample" and sampled.group.sent[0]["rows"] == []
    for idle, has_rows in ((GroupRollout(fake_engine(), FakeGroup(1, {0: rank0_eval}, index=1)), True),  # group 1
                           (GroupRollout(fake_engine(), FakeGroup(1, {0: rank0_eval}, index=0)), False)):  # no rows
        follow_evaluation(idle, has_rows, 1, 3, 0.0, 7)
        assert idle.group.sent == [] and idle.engine.llm.calls == []
    follow_evaluation(fake_engine(), True, 1, 3, 0.0, 7)  # k = 1: nothing to follow, no error


def _engine(**kw) -> EngineSettings:
    return EngineSettings(**kw)


@pytest.mark.parametrize("kw, world, extra, says", [
    (dict(vllm_tensor_parallel_size=2), 1, {}, "launch at least 2 ranks"),
    (dict(vllm_tensor_parallel_size=2), 3, {}, "3 ranks cannot form groups of 2"),
    (dict(vllm_tensor_parallel_size=2), 6, {"local_world": 3}, "would span two nodes"),
    (dict(vllm_tensor_parallel_size=2, rollout="transformers"), 2, {}, "set engine.rollout=vllm"),
    (dict(vllm_tensor_parallel_size=2, overlap="one_step"), 2, {}, "set engine.overlap=none"),
    (dict(vllm_tensor_parallel_size=2, parallel_start=True), 2, {}, "set engine.parallel_start=false"),
    (dict(vllm_tensor_parallel_size=2, max_staleness=1), 2, {}, "set engine.max_staleness=0"),
    (dict(vllm_tensor_parallel_size=2), 2, {"env": True}, "runs with an env"),
    (dict(vllm_tensor_parallel_size=2), 2, {"resamples": True}, "filter without resample"),
])
def test_refusals_name_the_key_and_the_fix(kw, world, extra, says):
    args = {"env": False, "resamples": False, **extra}
    with pytest.raises(ConfigError) as e:
        check_tensor_parallel(_engine(**kw), world, **args)
    assert e.value.where == "engine.vllm_tensor_parallel_size" and says in str(e.value)


def test_allowed_layouts():
    check_tensor_parallel(_engine(vllm_tensor_parallel_size=2), 2, env=False, resamples=False, local_world=2)
    check_tensor_parallel(_engine(vllm_tensor_parallel_size=2), 8, env=False, resamples=False, local_world=4)
    # k = 1 is today's engine: nothing is refused on its account
    check_tensor_parallel(_engine(overlap="one_step", rollout="transformers"), 3, env=True, resamples=True)
    with pytest.raises(Exception):
        _engine(vllm_tensor_parallel_size=0)


def test_vllm_starts_sharded_under_the_external_launcher_on_every_platform():
    from policyzoo.engine.rollout.vllm_options import llm_kwargs

    common = dict(dtype="float32", max_model_len=64, seed=1, tokenizer="m")
    cpu = llm_kwargs(on_cuda=False, tensor_parallel_size=2, **common)
    assert (cpu["distributed_executor_backend"], cpu["tensor_parallel_size"], cpu["enforce_eager"]) == (
        "external_launcher", 2, True)
    gpu = llm_kwargs(on_cuda=True, tensor_parallel_size=4, **common)
    assert (gpu["distributed_executor_backend"], gpu["tensor_parallel_size"]) == ("external_launcher", 4)
    one = llm_kwargs(on_cuda=False, **common)  # k = 1: today's in-process engine, one per rank
    assert one["distributed_executor_backend"] == "uni" and "tensor_parallel_size" not in one


@pytest.mark.parametrize("heads, kv, k, fits", [
    (9, 3, 2, "[1, 3, 9]"),  # SmolLM2-135M: 9 heads, 3 kv heads; 2 divides neither -> refused, 1/3/9 listed
    (32, 8, 3, "[1, 2, 4, 8, 16, 32]"),  # 16 and 32 replicate the 8 kv heads (16 % 8 == 0), 3 divides nothing
])
def test_tensor_parallel_size_must_shard_the_attention_heads(tmp_path, heads, kv, k, fits):
    from policyzoo.engine.rollout.tensor_parallel import check_heads

    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": heads, "num_key_value_heads": kv}))
    with pytest.raises(ConfigError) as e:
        check_heads(_engine(vllm_tensor_parallel_size=k), tmp_path)
    assert e.value.where == "engine.vllm_tensor_parallel_size" and f"one of {fits}" in str(e.value)
    check_heads(_engine(vllm_tensor_parallel_size=int(fits.strip("[]").split(", ")[-1])), tmp_path)  # k = heads fits
