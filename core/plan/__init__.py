"""``policyzoo plan``: what one step costs, worked out from a model's config (no weights loaded).

For P prompts of ``prompt`` tokens, G samples each and L response tokens per sample, the planner
counts the tokens and matmul FLOPs of every part of a step as the engine runs it, and the memory
each model holds. Conventions (those of Kaplan et al. 2020 and Korthikanti et al. 2022, adapted
to this engine; all stated so a reader can check them by hand, ``tests/test_plan.py`` does):

* **Parameters.** Per layer: attention ``h*dq + 2*h*dkv + dq*h`` (``dq = heads x head_dim``,
  ``dkv = kv_heads x head_dim``), MLP ``3*h*i`` (gated: gate, up, down) or ``2*h*i``, two norms
  ``2*h``; plus the embedding ``V*h``, an untied LM head ``V*h`` and the final norm ``h``.
  Biases are left out (< 0.1% on the models this targets).
* **Forward FLOPs** of one token = ``2 x`` the layer matmul parameters (multiply + add), plus
  ``2*h*V`` where logits are computed, plus ``4 * layers * dq * c`` for attention over ``c``
  earlier positions (QK^T and AV; ``c`` capped at a sliding window: the causal half, where torch's FLOP
  counter counts the full square and flash backward's recomputed scores). Backward = 2 x forward;
  gradient checkpointing re-runs each row's layers except the last matmul of each (the MLP's down projection:
  torch's non-reentrant checkpoint stops once the last saved tensor is rebuilt) and not the LM head
  (:meth:`Shape.recompute`). Norms, softmax, the optimizer: not counted.
* **Rollout** (vLLM): each prompt is prefilled once for its G samples (``n`` in one request,
  prefix cache), logits at its last position give token 1; tokens 2..L cost one decode forward
  each per sample, with logits.
* **Training forward** with ``engine.share_prompt`` (default): each distinct prompt once, logits at
  its last position only; then the first L - 1 response tokens per row, with logits (exactly the
  rollout's work). Without it each row runs ``prompt + L`` tokens with ``L + 1`` logits. The engine turns
  sharing off with gradient checkpointing, and so does the plan; at ZeRO 3 on several ranks the engine
  shares prompts too (the ranks agree on their model calls), but the plan counts that path per row, an
  upper bound that :mod:`policyzoo.testing.fake_step` traces (:func:`engine_path`;
  :func:`policyzoo.plan.gpu.per_gpu` passes the placement).
  The reference model (``kl`` components) runs the same forward without gradient; the policy runs
  an extra no-grad forward for old log-probs when ``updates_per_batch > 1`` or the KL goes into
  the reward. The critic (``needs_values`` baselines) runs each row in full without an LM head:
  once without gradient (old values), then forward + backward per update.
* **Memory**, bytes: weights ``n x dtype``; trained models add gradients (fp32: 4 n) and AdamW's two
  moments (8 n), plus fp32 master weights (4 n) when training in bf16; LoRA trains only the
  adapter's parameters (``r x (in + out)`` per adapted layer) and its reference is the base model
  inside the policy (no weights of its own).
* **Activations**: the peak of one training micro-batch, what autograd keeps for backward in transformers'
  Llama/Qwen2 code with ``sdpa`` attention, weights of ``b`` bytes, rows of ``c = prompt + L`` tokens
  (:meth:`Shape.act_bytes`), per token and layer: each of the two RMSNorms its fp32 input ``4h``, the
  normalised value cast back ``b h``, the scaled output ``b h`` and ``rsqrt`` 4 bytes; attention ``4 b dq``
  (q, and k, v repeated to every query head -- transformers repeats them when a mask is given, which a
  padded batch has --, the output) + ``4 x heads`` (fp32 logsumexp) + ``b c`` (the row of the additive mask
  each layer's sdpa keeps); MLP ``4 b i`` (gate, its SiLU, up, their product; ``2 b i`` ungated). Plus the
  final norm per token, and per scored position the logits (``b V``; the fused fp32 log-softmax keeps
  no vocabulary-wide fp32 tensor) with their gradient or the LM head's weight gradient (``b V h``) as autograd
  forms it, whichever is larger: the head's backward. The peak is every layer's set plus the larger of the head's
  backward and a layer's backward gradients (``2 b (i + h)`` per token: MLP and residual). With gradient
  checkpointing the ``b h`` layer inputs per token plus the larger of the head's backward and one layer rebuilt
  with its gradients. Micro-batches hold whole rows (``train.max_tokens_per_micro_batch`` B: ``max(1, B //
  (prompt + L))`` rows each; ``train.micro_batches`` k: ``ceil(P G / k)``); the largest one's share of the step
  is counted. Checked against the real transformers code run under ``FakeTensorMode`` with torch's
  ``MemTracker`` and ``FlopCounterMode`` (``tests/test_plan_fake.py``, :mod:`policyzoo.testing.fake_step`):
  within 1% for one micro-batch of Qwen2.5-7B and Llama-3.1-8B, with and without checkpointing.
* **KV cache**: ``2 x layers x dkv x dtype`` bytes per cached token (prompts once, each sample's
  response), next to the engine's reserved ``engine.kv_cache_gb``. One rank, ZeRO not applied.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from policyzoo.step import needs_reference

from .model_shape import DEFAULT_CONFIG, UNGATED, PlanError, Shape, load_shape

__all__ = ["DEFAULT_CONFIG", "DTYPE_BYTES", "GiB", "UNGATED", "Options", "PlanError", "Shape", "Sizes",
           "engine_path", "fitting_settings", "flops", "load_shape", "measured_split", "memory", "options_for"]

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GiB = 2**30


@dataclass(frozen=True)
class Sizes:
    prompts: int  # P
    samples: int  # G
    response: int  # L
    prompt: int = 103  # prompt tokens (the default task's few-shot prompts)


@dataclass(frozen=True)
class Options:
    dtype: str = "float32"
    need_ref: bool = True
    need_critic: bool = False
    old_logprobs: bool = False
    updates: int = 1
    share_prompt: bool = True
    gradient_checkpointing: bool = False
    micro_batches: int = 1
    max_tokens_per_micro_batch: int | None = None
    kv_cache_gb: float = 1.0
    lora_params: int | None = None  # trainable parameters when training a LoRA adapter


def engine_path(o: Options, zero3_ranks: bool = False) -> Options:
    """``o`` as the plan counts it: shared-prompt scoring is off with gradient checkpointing (the engine turns
    it off there) and, when ``zero3_ranks``, at ZeRO 3 on several ranks: the engine shares prompts there as
    well, and the per-row count is the upper bound the fit check uses (its FLOPs differ from ZeRO 0's)."""
    if o.share_prompt and (o.gradient_checkpointing or zero3_ranks):
        return dataclasses.replace(o, share_prompt=False)
    return o


def flops(m: Shape, s: Sizes, o: Options) -> dict[str, int]:
    """FLOPs of one step by part (keys in table order; absent parts are left out)."""
    o = engine_path(o)
    p, g, lp, n = s.prompts, s.samples, s.prompt, s.response
    prefill = p * m.forward(lp, 0, logits=1)
    decode = p * g * m.forward(n - 1, lp, logits=n - 1)
    if o.share_prompt:
        fwd = prefill + decode
    else:
        fwd = p * g * m.forward(lp + n, 0, logits=n + 1)
    again = p * g * m.recompute(lp + n) if o.gradient_checkpointing else 0  # checkpointing: per row
    out = {"rollout prefill": prefill, "rollout decode": decode,
           "policy forward": o.updates * fwd,
           "policy backward": o.updates * (2 * fwd + again)}
    if o.old_logprobs:
        out["policy old log-probs"] = fwd
    if o.need_ref:
        out["reference forward"] = fwd
    if o.need_critic:
        cfwd = p * g * m.forward(lp + n, 0, head=False)
        out["critic forward"] = (1 + o.updates) * cfwd
        out["critic backward"] = o.updates * (2 * cfwd + again)
    return out


def memory(m: Shape, s: Sizes, o: Options) -> dict[str, dict[str, int]]:
    """Bytes per model: ``{model: {weights, grads+optimizer, activations, kv cache}}``; activations are
    those of the largest micro-batch (module docstring)."""
    o = engine_path(o)
    b = DTYPE_BYTES[o.dtype]
    p, g, lp, n = s.prompts, s.samples, s.prompt, s.response
    rows = p * g
    if o.max_tokens_per_micro_batch:  # whole rows of prompt + response tokens, as many as the budget holds
        per_micro = max(1, min(rows, o.max_tokens_per_micro_batch // (lp + n)))
    else:
        per_micro = -(-rows // o.micro_batches)

    def share(x: int) -> int:  # the largest micro-batch's part of a step's x
        return -(-x * per_micro // rows)

    def trained(params: int, trainable: int, tokens: int, scored: int, head: bool) -> dict[str, int]:
        state = trainable * (4 + 8 + (4 if b != 4 else 0))  # fp32 grads, AdamW m and v, fp32 master in bf16
        layer = m.act_bytes(b, lp + n)
        logits = b * m.vocab * share(scored)  # logits and their gradient, or it and the LM head's weight gradient
        top = m.norm_bytes(b) * share(tokens) + (logits + max(logits, b * m.vocab * m.hidden) if head else 0)
        grads = 2 * b * (m.intermediate + m.hidden) * share(tokens)  # a layer's backward: MLP and residual gradients
        if o.gradient_checkpointing:  # layer inputs kept; then the head's backward, or one layer rebuilt at a time
            acts = m.layers * b * m.hidden * share(tokens) + max(top, layer * share(tokens) + grads)
        else:  # every layer's activations are kept until its own backward
            acts = m.layers * layer * share(tokens) + max(top, grads)
        return {"weights": params * b, "grads+optimizer": state, "activations": acts, "kv cache": 0}

    if o.share_prompt:
        tokens, scored = p * lp + rows * (n - 1), p + rows * (n - 1)
    else:
        tokens, scored = rows * (lp + n), rows * (n + 1)
    out = {"policy (trained)": trained(m.params, m.params if o.lora_params is None else o.lora_params,
                                       tokens, scored, True),
           "rollout (vLLM copy)": {"weights": m.params * b, "grads+optimizer": 0, "activations": 0,
                                   "kv cache": 2 * m.layers * m.dkv * b * (p * lp + p * g * n)}}
    if o.need_ref and o.lora_params is not None:  # the base model inside the policy, adapter off
        out["reference (adapter off)"] = {"weights": 0, "grads+optimizer": 0, "activations": 0, "kv cache": 0}
    elif o.need_ref:
        out["reference"] = {"weights": m.params * b, "grads+optimizer": 0, "activations": 0, "kv cache": 0}
    if o.need_critic:
        cparams = m.params - m.vocab * m.hidden * (0 if m.tied else 1) + m.hidden + 1
        out["critic (trained)"] = trained(cparams, cparams, rows * (lp + n), 0, False)
    return out


def fitting_settings(m: Shape, s: Sizes, o: Options, budget: int) -> list[tuple[str, int]]:
    """Settings that bring one rank's total (every model of :func:`memory`) within ``budget``
    bytes, with the total each gives: ``train.gradient_checkpointing=true`` alone, the largest
    ``train.max_tokens_per_micro_batch`` (a power of two, at least one row's tokens) alone, and
    both only when neither fits alone. Empty when nothing activation-side fits (the weights and
    optimizer state alone are too large)."""
    def total(opts: Options) -> int:
        return sum(sum(parts.values()) for parts in memory(m, s, opts).values())

    def largest_budget(opts: Options) -> int | None:
        k = 1 << (s.prompts * s.samples * (s.prompt + s.response)).bit_length()
        while k >= s.prompt + s.response:  # a micro-batch holds at least one row
            if total(dataclasses.replace(opts, max_tokens_per_micro_batch=k)) <= budget:
                return k
            k //= 2
        return None

    out = []
    ckpt = dataclasses.replace(o, gradient_checkpointing=True)
    if not o.gradient_checkpointing and total(ckpt) <= budget:
        out.append(("train.gradient_checkpointing=true", total(ckpt)))
    k = largest_budget(o)
    if k is not None:
        out.append((f"train.max_tokens_per_micro_batch={k}",
                    total(dataclasses.replace(o, max_tokens_per_micro_batch=k))))
    if not out and not o.gradient_checkpointing and (k := largest_budget(ckpt)) is not None:  # only both fit
        out.append((f"train.gradient_checkpointing=true train.max_tokens_per_micro_batch={k}",
                    total(dataclasses.replace(ckpt, max_tokens_per_micro_batch=k))))
    return out


def options_for(config, run, shape: Shape) -> Options:
    """The planner's options for a resolved run configuration (which models the algorithm needs)."""
    kl, lo = run.kl, config.model.lora
    return Options(dtype=config.model.dtype, need_ref=needs_reference(run), need_critic=run.baseline.needs_values,
                   old_logprobs=config.train.updates_per_batch > 1 or (kl is not None and kl.params.placement ==
                                                                      "reward"),
                   updates=config.train.updates_per_batch, share_prompt=config.engine.share_prompt,
                   micro_batches=config.train.micro_batches,
                   max_tokens_per_micro_batch=config.train.max_tokens_per_micro_batch,
                   kv_cache_gb=config.engine.kv_cache_gb,
                   gradient_checkpointing=config.train.gradient_checkpointing,
                   lora_params=shape.lora_params(lo.r, lo.target_modules) if lo is not None else None)


def measured_split(records: list[dict]) -> dict[str, float]:
    """Median seconds per step of rollout, train and sync over a run's train records (the first
    step, which pays warm-up, left out when there are more), and the median response and prompt
    tokens per row (``prompt_tokens / sampled_rows``; None where the run logged none)."""
    import statistics

    train = [r for r in records if r.get("kind", "train") == "train" and "time_train" in r]
    if len(train) > 1:
        train = train[1:]
    if not train:
        raise PlanError("--from-run", "the run has no finished training step in metrics.jsonl",
                        "train at least one step first")
    per_row = [r["prompt_tokens"] / (r.get("sampled_rows") or r["rows"]) for r in train
               if r.get("prompt_tokens") and (r.get("sampled_rows") or r.get("rows"))]
    return {k: statistics.median(r.get(f"time_{k}", 0.0) for r in train) for k in ("rollout", "train", "sync")} | {
        "response_length_mean": statistics.median(r.get("response_length_mean", 0.0) for r in train),
        "prompt_length_mean": statistics.median(per_row) if per_row else None}
