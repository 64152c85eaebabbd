"""``LMPolicy``: the :class:`policyzoo.contract.TokenPolicy` of a real language model.

It joins a rollout engine (vLLM in this process, a rollout server, or the transformers fallback) and the
DeepSpeed trainer: sampling goes to the rollout engine, scoring and the update to the trainer, and
:meth:`~LMPolicy.sync` to the run's :class:`~policyzoo.engine.sync.WeightSync`, which pushes the trained
weights into the rollout engine after every optimizer step and checks them (the sync room,
``policyzoo.engine.sync``). On a GPU with ``engine.vllm_sleep`` every trainer call tells the sync that the
trainer takes over (vLLM's weights and KV cache leave the GPU), and every sampling call that the sampler
does (a level-2 engine without its weights gets them pushed first).
"""

from __future__ import annotations

import time

import torch

from policyzoo.contract import SAMPLING_OPTIONS, Rollout, StepTotals
from policyzoo.step.episodes import DrivesEpisodes

from .dist import DistCollective, sum_ints


class LMPolicy(DrivesEpisodes):
    """Policy over a causal LM: ``rollout`` (VLLMRollout, ServerRollout or HFRollout) + ``trainer`` (Trainer),
    kept in step by ``weight_sync`` (a :class:`~policyzoo.engine.sync.WeightSync` over the same two).
    ``stats`` accumulates rollout token counts for throughput metrics."""

    #: every sampling option of :data:`policyzoo.contract.SAMPLING_OPTIONS` (both rollout engines take them)
    sampling_options = frozenset(SAMPLING_OPTIONS)

    def __init__(self, rollout, trainer, weight_sync):
        self.rollout, self.trainer, self.weight_sync = rollout, trainer, weight_sync
        self.stats = {"tokens": 0, "seconds": 0.0}
        #: global index of this rank's first prompt in the step (data parallel; 0 on one rank)
        self.first_index = 0
        self.collective = DistCollective()

    # --------------------------------------------------------------------- Policy protocol
    def generate(self, prompts: list[dict], n: int, max_tokens: int, temperature: float, seed: int,
                 top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0, repetition_penalty: float = 1.0,
                 stop: list[str] = ()) -> Rollout:
        self.weight_sync.before_sampling()
        t0 = time.perf_counter()
        if temperature == 0 and n == 1:  # greedy decoding (a baseline response, e.g. ReMax's)
            out = self.rollout.greedy(prompts, max_tokens)
        else:
            out = self.rollout.generate(prompts, n, max_tokens, temperature, seed, top_p=top_p, top_k=top_k,
                                        min_p=min_p, repetition_penalty=repetition_penalty, stop=list(stop),
                                        first_index=self.first_index)
        self.stats["seconds"] += time.perf_counter() - t0
        self.stats["tokens"] += int(out.response_mask.sum())
        self.stats["prompt_tokens"] = self.stats.get("prompt_tokens", 0) + sum(len(x) for x in out.prompt_ids)
        return out

    @property
    def tokenizer(self):
        return self.rollout.tokenizer

    @property
    def device(self) -> torch.device:
        """The trainer's device: the step moves its batch there once and keeps it there
        (``policyzoo.step.learn``)."""
        return self.trainer.device

    @property
    def pad_token_id(self) -> int:
        return self.rollout.info.pad_token_id

    def generate_tokens(self, contexts: list[list[int]], max_tokens: list[int], temperature: float,
                        seeds: list[int], top_p: float = 1.0, **options):
        """Batched continuation of token-id contexts (multi-turn episodes; see
        :class:`policyzoo.contract.TokenPolicy`); ``options``: the other sampling options."""
        self.weight_sync.before_sampling()
        t0 = time.perf_counter()
        out = self.rollout.generate_tokens(contexts, max_tokens, temperature, seeds, top_p=top_p, **options)
        self.stats["seconds"] += time.perf_counter() - t0
        self.stats["tokens"] += sum(len(g.ids) for g in out)
        return out

    def run_episodes(self, env, rows: list[dict], n: int, max_tokens: int, temperature: float, seed: int,
                     top_p: float = 1.0, **options) -> Rollout:
        """The step's token-exact episode loop on this engine (:func:`policyzoo.step.episodes.run_episodes`);
        its rows' prompt tokens are counted in ``stats["prompt_tokens"]`` as single-turn rows' are
        (``tokens_seen``, ``plan --from-run``; the turns' generated tokens count in ``tokens``)."""
        out = super().run_episodes(env, rows, n, max_tokens, temperature, seed, top_p=top_p, **options)
        self.stats["prompt_tokens"] = self.stats.get("prompt_tokens", 0) + sum(len(x) for x in out.prompt_ids)
        return out

    def logprobs(self, rollout: Rollout, *, grad: bool, entropy: bool = False, entropy_grad: bool = False):
        self.weight_sync.for_training()
        return self.trainer.logprobs(rollout, grad=grad, entropy=entropy, entropy_grad=entropy_grad)

    def ref_logprobs(self, rollout: Rollout) -> torch.Tensor:
        self.weight_sync.for_training()
        return self.trainer.ref_logprobs(rollout)

    def sum_pi_squared(self, rollout: Rollout) -> torch.Tensor:
        self.weight_sync.for_training()
        return self.trainer.sum_pi_squared(rollout)

    def values(self, rollout: Rollout, *, grad: bool) -> torch.Tensor:
        self.weight_sync.for_training()
        return self.trainer.values(rollout, grad=grad)

    def backward(self, loss: torch.Tensor, value_loss: torch.Tensor | None = None) -> None:
        self.weight_sync.for_training()
        self.trainer.backward(loss, value_loss)

    def optimizer_step(self, skip: bool = False) -> dict:
        """``skip``: the step found a non-finite reward, log-prob or loss; the trainer discards
        the accumulated gradients and leaves weights and optimizer state unchanged (on every
        rank: the flag is agreed over ranks inside ``Trainer.step``)."""
        return self.trainer.step(skip=skip)

    def reduce_totals(self, totals):
        """The step's normalisers summed over data-parallel ranks (``policyzoo.engine.dist``)."""
        rows = totals.sequences if totals.rows is None else totals.rows
        tokens, sequences, rows = sum_ints([totals.tokens, totals.sequences, rows])
        return StepTotals(tokens=tokens, sequences=sequences, rows=rows)

    def sync(self) -> dict:
        """The weight sync after an optimizer step: :meth:`policyzoo.engine.sync.WeightSync.sync`
        (its metrics: ``sync_seconds``, and with the check ``sync_max_diff`` / ``sync_mean_diff``)."""
        return self.weight_sync.sync()
