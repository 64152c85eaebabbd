"""vLLM's sleep mode around the weight sync (``engine.vllm_sleep``; a GPU only).

**Sleep** (:class:`Sleeper`; TRL's ``vllm_enable_sleep_mode``, verl's ``free_cache_engine``, OpenRLHF's
``--vllm_enable_sleep``): level 1 offloads the weights to host memory and drops the KV cache, level 2 drops
both (the next push refills the weights; vLLM keeps the buffers). The order per step, as TRL's colocate
generation and verl's rollout manager do it:

1. before sampling (and before the sync check, which samples): ``wake_up(tags=["kv_cache"])``;
2. when the trainer first runs after sampling: ``sleep(level)``;
3. before the weight push: ``empty_cache`` then ``wake_up(tags=["weights"])`` (weights written into
   unmapped memory are lost).

A level-2 engine asked to sample with its weights dropped and no push since (a skipped update) holds no
weights worth waking: :meth:`Sleeper.weights_dropped` says so, and the sync pushes the trainer's weights
first (:meth:`policyzoo.engine.sync.push.WeightSync.before_sampling`); the engine never calls back.
"""

from __future__ import annotations


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
