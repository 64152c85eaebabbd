"""One-step off-policy overlap (``engine.overlap: one_step``): sample batch n+1 while training on n.

Without it a step is sample -> reward -> train -> sync, and the rollout engine idles while the
trainer works (and the other way round). With it, as soon as step n's batch is collected, the
session asks :class:`OverlapPolicy` to start sampling step n+1's first round in a background
thread with the weights the rollout engine holds now (those after step n-1), and trains on batch n
meanwhile. ``sync`` waits for that sampling to finish (the engine must not change weights under a
running generation), then pushes step n's weights. Step n+1's ``generate`` call then finds its
batch ready, sampled one optimizer step behind the weights it trains: ``policy_lag`` 1 on every
row (recorded per row in ``Rollout.policy_lag``; metrics ``policy_lag_max``, ``policy_lag_mean``),
and ``policy.step.learn`` takes the sampler's ``rollout_logprobs`` as the behaviour policy's
log-probs for the ratio.

The staleness bound: a prefetched batch whose lag would exceed ``max_lag`` is dropped and sampled
again with the current weights (metric ``stale_dropped``); so is one whose request differs from the
call that arrives (another round of dynamic sampling, other prompts). Only the sampling runs in the
background thread (the ``sample`` component and the rollout engine); rewards and filters run in
the main thread as always. No prefetch crosses a checkpoint or an evaluation, so a resumed run
replays the same steps.

Gain: the step takes max(sampling, training) + sync instead of their sum when the two use
different devices (rollout engine and trainer on separate GPUs, or a GPU idle while the CPU
tokenises); on one shared CPU both compete for the same cores, so the gain is what one side
leaves idle (Python overhead, memory-bound decode next to compute-bound training).
"""

from __future__ import annotations

import threading

import torch

from policyzoo.contract import Rollout
from policyzoo.engine.device import on_device
from policyzoo.step import dispatch, round_seed

from .passthrough import PassThrough


class OverlapPolicy(PassThrough):
    """A Policy over ``inner`` that can sample one request ahead (:meth:`prefetch`): ``generate`` and
    ``sync`` are its own, every other method of the protocol passes to ``inner`` (:class:`PassThrough`)."""

    def __init__(self, inner, max_lag: int = 1):
        super().__init__(inner)
        self.max_lag = max_lag
        #: optimizer steps pushed into the rollout engine so far (the version sampling uses)
        self.version = 0
        self.stale_dropped = 0
        self._pending: dict | None = None
        #: sampling counters (tokens, prompt_tokens, seconds) booked to the step that trains on the
        #: batch, not the step during which it was sampled (the inner policy's ``stats`` count the latter)
        self.stats = {"tokens": 0, "prompt_tokens": 0, "seconds": 0.0}

    def _counted(self, generate):
        """``generate()``'s rollout and what it added to the inner policy's counters."""
        before = dict(getattr(self.inner, "stats", {}))
        out = generate()
        after = getattr(self.inner, "stats", {})
        return out, {k: after.get(k, 0) - before.get(k, 0) for k in self.stats}

    def _book(self, delta: dict) -> None:
        for k, v in delta.items():
            self.stats[k] += v

    # ------------------------------------------------------------------ ahead of time
    def prefetch(self, sample) -> None:
        """Run ``sample(recorder)`` in a background thread now: ``sample`` calls the ``sample``
        component with a policy whose ``generate`` records its arguments and samples with the
        rollout engine's current weights."""
        self.wait()
        box: dict = {"version": self.version}

        class Recorder(PassThrough):  # the inner policy, with its generate calls recorded
            def generate(_, prompts, n, max_tokens, temperature, seed, **options):
                box["call"] = (prompts, n, max_tokens, temperature, seed, options)
                box["rollout"], box["stats"] = self._counted(
                    lambda: self.inner.generate(prompts, n, max_tokens, temperature, seed, **options))
                return box["rollout"]

        def run():
            try:
                sample(Recorder(self.inner))
            except BaseException as e:  # noqa: BLE001 - re-raised (or dropped) in the main thread
                box["error"] = e

        box["thread"] = threading.Thread(target=on_device(run), name="policyzoo-prefetch", daemon=True)
        box["thread"].start()
        self._pending = box

    def wait(self) -> dict | None:
        """Wait for the sampling in flight, if any; returns its record (left pending)."""
        if self._pending is not None:
            self._pending["thread"].join()
        return self._pending

    # ------------------------------------------------------------------ Policy protocol
    def generate(self, prompts: list[dict], n: int, max_tokens: int, temperature: float, seed: int,
                 **options) -> Rollout:
        """The prefetched batch when it was asked with these arguments and is at most ``max_lag``
        steps behind (``policy_lag [B]`` set to its lag), else a fresh one (``policy_lag`` 0). Every
        sampling option of ``inner.sampling_options`` passes through and is part of the request a
        prefetched batch is matched by."""
        box = self.wait()
        self._pending = None
        call = (prompts, n, max_tokens, temperature, seed, options)  # options: the set sampling options
        if box is not None and "error" not in box and box.get("call") == call:
            lag = self.version - box["version"]
            if lag <= self.max_lag:
                out = box["rollout"]
                out.policy_lag = torch.full((len(out),), lag, dtype=torch.long)
                self._book(box["stats"])
                return out
        if box is not None:
            self.stale_dropped += 1
        out, delta = self._counted(lambda: self.inner.generate(prompts, n, max_tokens, temperature, seed, **options))
        self._book(delta)
        out.policy_lag = torch.zeros(len(out), dtype=torch.long)
        return out

    def sync(self) -> dict:
        """Wait for the sampling in flight (it uses the engine's current weights), then push."""
        self.wait()
        out = self.inner.sync()
        self.version += 1
        return out


class OverlapAhead:
    """``engine.overlap: one_step`` as the step's :class:`~policyzoo.step.learn.Ahead`: once step n's
    batch is collected, start sampling step n+1's first round (with ``next_seed``; None when a
    checkpoint, an evaluation or the end comes first: nothing sampled ahead crosses them); after the
    update, wait for it (a failed or skipped update leaves no sampling running into the next step).
    Adds ``stale_dropped`` (this step's dropped prefetches). ``policy`` is the
    :class:`OverlapPolicy` the step samples from."""

    def __init__(self, run, policy: OverlapPolicy):
        self.run, self.policy = run, policy
        self.next_seed, self.next_prompts, self._dropped = None, None, 0

    def begin(self, next_seed: int | None, next_prompts) -> "OverlapAhead":
        """This step's plan: the next step's seed (or None) and the prompt stream
        (``next_prompts(peek=True)`` returns the next prompts without drawing them)."""
        self.next_seed, self.next_prompts = next_seed, next_prompts
        return self

    def before(self) -> None:
        self._dropped = self.policy.stale_dropped

    def collected(self) -> None:
        self._dropped = self.policy.stale_dropped - self._dropped
        if self.next_seed is not None:
            run, prompts, ahead = self.run, self.next_prompts(peek=True), round_seed(self.next_seed, 0)
            rows = len(prompts) * (run.sample.params.n + run.sample.params.greedy)
            self.policy.prefetch(lambda rec: dispatch.call(run, "sample", rows=rows, policy=rec, prompts=prompts,
                                                           seed=ahead, env=run.env))

    def learned(self) -> dict:
        self.policy.wait()
        return {"stale_dropped": self._dropped}
