"""The weight sync: after every optimizer step the trainer's weights go into the rollout engine, in one
direction (trainer -> rollout; nothing here is called back by the rollout engine, and the rollout engine
imports only the vLLM-side pieces at the end of this module: :class:`Sleeper`, :func:`refresh_cpu_kernels`,
:func:`stale_gemm_modules`). A sync bug starts here; the module reads in the order one sync runs
(:meth:`WeightSync.sync`):

1. **gather** (:func:`full_weights`): the trainer's full weights as ``(hf_name, tensor)`` pairs, one
   parameter at a time under ZeRO-3, merged one layer at a time under LoRA;
2. **wake** (:class:`Sleeper`): with ``engine.vllm_sleep`` vLLM's weights are mapped again before they are
   written (and its KV cache before it samples);
3. **push** (:meth:`WeightSync.push`): the rollout engine's ``load_weights`` consumes the pairs (vLLM's
   ``reload_weights`` in ``rollout/vllm_engine.py``, then the CPU kernels a reload leaves stale,
   :func:`refresh_cpu_kernels`, and its prefix cache reset; a rollout server through
   ``rollout/server/weight_push.py``; transformers' ``copy_`` in ``rollout/hf.py``), under
   ``engine.sync_timeout_s`` (:func:`run_with_timeout`);
4. **check** (:func:`check_weights`, ``engine.sync_check``): a fixed sequence scored by both sides, within
   the tolerance of the trainer's and the sampler's dtypes (:data:`SYNC_TOLERANCE`), or :class:`SyncError`.

**vLLM's sleep mode** (:class:`Sleeper`, ``engine.vllm_sleep``, a GPU only; TRL's ``vllm_enable_sleep_mode``,
verl's ``free_cache_engine``, OpenRLHF's ``--vllm_enable_sleep``): level 1 offloads the weights to host memory
and drops the KV cache, level 2 drops both (the next push refills the weights; vLLM keeps the buffers). The
order per step, as TRL's colocate generation and verl's rollout manager do it:

1. before sampling (and before the sync check, which samples): ``wake_up(tags=["kv_cache"])``;
2. when the trainer first runs after sampling: ``sleep(level)``;
3. before the weight push: ``empty_cache`` then ``wake_up(tags=["weights"])`` (weights written into
   unmapped memory are lost).

A level-2 engine asked to sample with its weights dropped and no push since (a skipped update) holds no
weights worth waking: :meth:`Sleeper.weights_dropped` says so, and the sync pushes the trainer's weights
first (:meth:`WeightSync.before_sampling`); the engine never calls back.

**vLLM-CPU's kernels**: the pre-packed GEMM kernels that a weight reload leaves stale (vLLM 0.32's CPU linear
layers, ``dispatch_cpu_unquantized_gemm``), found and rebuilt. The colocated engine's ``load_weights`` runs
:func:`refresh_cpu_kernels` in its worker; the rollout server's worker (``rollout/server/worker.py``) rebuilds
:func:`stale_gemm_modules` at the end of a push.
"""

from __future__ import annotations

import contextlib
import threading
import time

import torch

from policyzoo.engine.device import on_device, release_cached_memory
from policyzoo.engine.trainer import lora as lora_mod
from policyzoo.errors import UserError

# ----------------------------------------------------------------------------- push: the sync, in order

def cached_prefix(check_ids: list[int], max_model_len: int) -> list[int]:
    """``check_ids`` repeated up to ``max_model_len - 1`` tokens: the prefix the check scores through the
    generation path, so that every cached block of it is read (``max_model_len``: tokens)."""
    return (check_ids * (max_model_len // len(check_ids) + 1))[:max_model_len - 1]


class WeightSync:
    """Pushes ``trainer``'s weights (``full_weights()``: :func:`full_weights`) into ``rollout``
    (``load_weights``: vLLM, a server or transformers) and checks them.

    ``check`` (``engine.sync_check``): after each push :func:`~check_weights`
    compares both sides' log-probs on ``check_ids`` (e.g. the first held-out prompt and its answer) and
    on the next tokens after ``cached_ids`` (default ``check_ids``) within ``tolerance`` nats (max) and
    ``mean_tolerance`` (mean; None: ``tolerance``). ``timeout_s`` (``engine.sync_timeout_s``) bounds the
    push and each of the check's calls. ``rollout.sleeper`` (vLLM's sleep mode, :class:`Sleeper`), when the
    engine has one, is told when the trainer takes over (:meth:`for_training`) and woken for the push."""

    def __init__(self, rollout, trainer, *, check: bool, tolerance: float, timeout_s: float,
                 check_ids: list[int], cached_ids: list[int] | None = None, mean_tolerance: float | None = None):
        self.rollout, self.trainer = rollout, trainer
        self.check, self.tolerance, self.timeout_s = check, tolerance, timeout_s
        self.mean_tolerance = mean_tolerance
        self.check_ids = check_ids
        #: the prefix scored through the generation path (default: ``check_ids``)
        self.cached_ids = cached_ids or check_ids
        #: mean |difference| of the last sync check (nats; the max is its return value)
        self.last_mean_diff: float | None = None
        self.sleeper = getattr(rollout, "sleeper", None)  # vLLM's sleep mode (GPU, engine.vllm_sleep)

    def sync(self) -> dict:
        """Push the trainer's weights into the rollout engine (within ``timeout_s``), release the CUDA
        allocator's cached blocks, and with the check on compare log-probs; returns the metrics
        ``sync_seconds`` (s) and, with the check, ``sync_max_diff`` / ``sync_mean_diff`` (nats).
        Raises :class:`~SyncError` on a timeout or a failed check."""
        t0 = time.perf_counter()
        run_with_timeout(self.push, self.timeout_s, "pushing weights into the rollout engine")
        release_cached_memory()  # the gathered copies' blocks, back to the GPU for vLLM's KV cache
        out = {"sync_seconds": time.perf_counter() - t0}
        if self.check:
            out["sync_max_diff"] = self.check_now()
            out["sync_mean_diff"] = self.last_mean_diff
        return out

    def push(self) -> None:
        """The trainer's full weights, consumed by the rollout engine's ``load_weights`` (every rank: a
        ZeRO-3 gather is collective)."""
        with self.trainer.full_weights() as weights:
            self.rollout.load_weights(weights)

    def check_now(self) -> float:
        """The sync check now: its max |difference| (nats; the mean in :attr:`last_mean_diff`); raises
        :class:`~SyncError` above the tolerances."""
        mean_bound = self.tolerance if self.mean_tolerance is None else self.mean_tolerance
        diff, self.last_mean_diff = check_weights(self.trainer, self.rollout, self.check_ids, self.cached_ids,
                                                  self.tolerance, mean_bound, self.timeout_s)
        return diff

    def for_training(self) -> None:
        """The trainer is about to run: vLLM sleeps (when its sleep mode is on)."""
        if self.sleeper is not None:
            self.sleeper.for_training()

    def before_sampling(self) -> None:
        """The policy is about to sample: a level-2 engine that dropped its weights with no push since
        (e.g. after a skipped update) gets the trainer's weights pushed first; waking alone would sample
        from garbage (:meth:`Sleeper.weights_dropped`)."""
        if self.sleeper is not None and self.sleeper.weights_dropped():
            self.push()


# ----------------------------------------------------------------------------- gather: the trainer's side

#: stream the sync: gather and yield one parameter at a time (False: gather the whole model first)
STREAMED = True


def _gathered_one_at_a_time(params):
    import deepspeed

    for name, p in params:
        with deepspeed.zero.GatheredParameters([p], modifier_rank=None):
            yield name, p.data


@contextlib.contextmanager
def full_weights(trainer, streamed: bool | None = None):
    """An iterable of ``(hf_name, tensor)``: the policy's full weights of ``trainer`` (its DeepSpeed
    ``engine``, ZeRO ``stage`` and ``lora``), in ``named_parameters`` order on every rank (the order
    the ZeRO-3 gathers must agree on); tensors keep the trainer's dtype and device.

    * ZeRO 0-2: every weight is whole on every rank; nothing is gathered or copied.
    * ZeRO 3, ``streamed`` (default :data:`STREAMED`): a generator that gathers one parameter
      (``GatheredParameters([p])``), yields it and releases it when the consumer asks for the next,
      so a rank holds one gathered parameter beyond its shard (plus what the consumer keeps: vLLM's
      layer-wise loader keeps the tensors of one layer until the layer is complete; a released
      parameter's tensor stays valid while referenced, DeepSpeed only rebinds ``param.data``).
      TRL and OpenRLHF gather one parameter at a time too. Every rank must consume it to the end.
    * ZeRO 3, not streamed: the whole model gathered at once (a full copy per rank), as a list.
    * LoRA (ZeRO 0-2): the merged weights, computed one layer at a time as they are consumed
      (:func:`policyzoo.engine.trainer.lora.merged_weights`).
    """
    import deepspeed

    if trainer.lora:  # ZeRO 0-2 only: every weight is held whole on every rank
        yield lora_mod.merged_weights(trainer.engine.module)
        return
    params = list(trainer.engine.module.named_parameters())
    if trainer.stage != 3:
        yield ((n, p.data) for n, p in params)
        return
    if STREAMED if streamed is None else streamed:
        yield _gathered_one_at_a_time(params)
        return
    with deepspeed.zero.GatheredParameters([p for _, p in params], modifier_rank=None):
        yield [(n, p.data) for n, p in params]


# ----------------------------------------------------------------------------- check: the sync's bounds

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


def check_weights(trainer, rollout, check_ids: list[int], cached_ids: list[int], tolerance: float,
                  mean_tolerance: float, timeout_s: float) -> tuple[float, float]:
    """``(max, mean)`` |trainer - rollout engine| log-prob (nats) over ``check_ids`` (prompt log-probs,
    ``[len(check_ids) - 1]`` per engine) and over the top next tokens after ``cached_ids`` (the generation
    path, which reads vLLM's prefix cache first); each of a rollout's ``replicas()`` (servers) is checked.
    Raises :class:`SyncError` when the max exceeds ``tolerance`` or the mean ``mean_tolerance`` (NaN too)."""
    b = trainer.score_sequence(check_ids)
    full = trainer.next_logprobs(cached_ids)
    diffs = []
    for engine in getattr(rollout, "replicas", lambda: [rollout])():  # several rollout servers: each
        nxt = run_with_timeout(lambda: engine.score_next(cached_ids), timeout_s, "the sync check")
        a = run_with_timeout(lambda: engine.score(check_ids), timeout_s, "the sync check")
        cached = torch.tensor([v - float(full[t]) for t, v in nxt.items()])
        diffs += [(a - b).abs(), cached.abs()]
    diffs = torch.cat(diffs)
    diff, mean = float(diffs.max()), float(diffs.mean())  # NaN propagates
    if not (diff <= tolerance and mean <= mean_tolerance):  # also catches NaN
        raise SyncError("weight sync check", f"after the sync the rollout engine's log-probs differ from the "
                        f"trainer's by up to {diff:.3g} nats (mean {mean:.3g}) on a fixed "
                        f"{len(check_ids)}-token sequence (tolerance {tolerance:g}, of the mean {mean_tolerance:g})",
                        "if engine.sync_tolerance is set below the sampler's own rounding (a bf16 sampler: "
                        "up to ~0.9 nats max, ~0.06 mean), unset it to use the defaults; otherwise the rollout "
                        "engine is sampling from other weights than the ones trained: report it with the model "
                        "folder; engine.rollout: transformers avoids vLLM meanwhile")
    return diff, mean


# ----------------------------------------------------------------------------- sleep: vLLM's sleep mode

class Sleeper:
    """The sleep state of one ``vllm.LLM`` (``llm``): calls ``sleep``/``wake_up`` only on a change of
    state, so the engine may ask at every call site. ``level`` 0: never sleeps (every method a no-op).
    ``release``: returns the allocator's cached blocks before the weights wake (``torch.cuda.empty_cache``)."""

    def __init__(self, llm, level: int, release=lambda: None):
        self.llm, self.level, self.release = llm, level, release
        self.weights_awake = self.kv_awake = True

    def weights_dropped(self) -> bool:
        """Level 2 asleep: the weights are gone, waking them would sample from garbage; only a push
        brings them back."""
        return self.level == 2 and not self.weights_awake

    def for_sampling(self) -> None:
        """Before vLLM samples: the KV cache back (the weights were woken for the last push)."""
        if self.level and not self.kv_awake:
            if not self.weights_awake:
                self.llm.wake_up(tags=["weights"])
                self.weights_awake = True
            self.llm.wake_up(tags=["kv_cache"])
            self.kv_awake = True

    def for_training(self) -> None:
        """The trainer is about to run: vLLM's weights and KV cache leave the GPU."""
        if self.level and (self.kv_awake or self.weights_awake):
            self.llm.sleep(level=self.level)
            self.weights_awake = self.kv_awake = False

    def for_push(self) -> None:
        """Before the weights are pushed: their memory mapped again (the KV cache stays asleep)."""
        if self.level and not self.weights_awake:
            self.release()
            self.llm.wake_up(tags=["weights"])
            self.weights_awake = True


# ----------------------------------------------------------------------------- vLLM-CPU's kernels after a push

def stale_gemm_modules(model) -> list:
    """The modules of a vLLM-CPU model whose pre-packed GEMM handler a weight push leaves stale:
    those that keep their weight tensor after loading (vLLM 0.32 empties the weight of every
    linear layer, whose handler its ``reload_weights`` rebuilds itself; the LM head tied to the
    embedding keeps it and is not rebuilt). The input embedding is left out unless it is the
    model's ``lm_head`` itself: it looks tokens up and its GEMM handler is never called, so
    rebuilding it (a prepack of the whole vocabulary matrix) was wasted work. Whether a weight
    changed is not tested: vLLM's loader writes through ``param.data``, which bumps no version
    counter, and comparing values would read the matrix anyway."""
    head = getattr(model, "lm_head", None)
    out = []
    for module in model.modules():
        w = getattr(module, "weight", None)
        if not (hasattr(module, "cpu_linear") and isinstance(w, torch.Tensor) and w.dim() == 2 and w.numel() > 0):
            continue
        if type(module).__name__ == "VocabParallelEmbedding" and module is not head:
            continue
        out.append(module)
    return out


def refresh_cpu_kernels(worker) -> int:
    """Rebuild the stale CPU GEMM handlers (:func:`stale_gemm_modules`); returns how many."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return 0
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    stale = stale_gemm_modules(worker.model_runner.model)
    for module in stale:
        dispatch_cpu_unquantized_gemm(module, remove_weight=False)
    return len(stale)
