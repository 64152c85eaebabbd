"""One training step of a real transformers model executed under ``FakeTensorMode``: its peak memory
by category and its FLOPs, measured with torch's own tools, to hold ``policyzoo plan``'s formulas to.

No weights, no GPU: the model is built on the ``meta`` device from a ``config.json`` dict (e.g. a shape of
:data:`policyzoo.plan.shapes.SHAPES`), moved to fake CPU tensors (``to_empty``) and run as the engine runs
a training micro-batch without shared-prompt scoring (the engine's path at ZeRO 3 on several ranks and
with gradient checkpointing): the forward of ``rows`` rows of ``prompt + response`` tokens with an
attention mask and position ids, logits at the ``response + 1`` last positions
(``logits_to_keep``), the engine's fused fp32 log-probs of them
(:func:`policyzoo.engine.trainer.logprob.fused_token_logprobs`), a loss, backward; then one AdamW
step of fp32 master weights (when the model is in bf16) with fp32 gradients, as DeepSpeed's bf16
optimizer holds them. Measured with ``torch.distributed._tools.mem_tracker.MemTracker`` (bytes by
category: parameters, activations, temporaries, optimizer state) and
``torch.utils.flop_counter.FlopCounterMode`` (matmul and attention FLOPs, torch's formulas: attention
counts the full ``s_q x s_k`` square, as a masked kernel computes it, and flash backward's recomputed scores,
where the planner counts only the causal half), the latter in a second pass of the same step: its module hooks
keep tensors that gradient checkpointing frees, which would inflate the peak.

Conventions of the measurement (stated so the comparison is fair):

* **ZeRO 3 gradients**: each parameter's full gradient is dropped as soon as it is accumulated (a
  post-accumulate hook), as ZeRO 3 reduce-scatters it into the rank's fp32 partition and frees it; the
  fp32 gradients are counted with the optimizer state (``grads``), whole, for the caller to divide by the
  ranks.
* **activations**: the peak, over the step, of everything but the parameters and buffers (activations
  saved for backward, temporaries, the transient gradient of the module running backward).
* A fake tensor's values are unknown, so transformers cannot see that a mask is all ones: the 4-D mask is
  built and K/V are repeated to every query head as for a padded batch (the engine's batches are padded:
  prompts left, responses right).
* sdpa attention (transformers' ``sdpa``, the default); the CPU flash kernel's FLOPs are counted with
  torch's formula for the GPU's sdpa kernels (the counter registers none for the CPU op).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from policyzoo.engine.trainer.logprob import fused_token_logprobs
from policyzoo.engine.trainer.modeling import enable_gradient_checkpointing


@dataclass(frozen=True)
class Measured:
    """One fake step of a model of ``layers`` layers. Bytes: ``params`` (weights, model dtype), ``grads``
    (fp32, whole model), ``optimizer`` (AdamW's moments plus fp32 master weights when the model is not
    fp32), ``activations`` (peak of all else during forward + backward); ``flops`` of forward + backward
    (+ the recompute with checkpointing)."""

    layers: int
    params: int
    grads: int
    optimizer: int
    activations: int
    flops: int

    def at(self, other: "Measured", layers: int) -> "Measured":
        """Linear extrapolation to ``layers`` layers through this measurement and ``other``'s (another layer
        count): each quantity is ``base + layers x per_layer``, the per-layer part the difference over the
        two counts, the base (embedding, LM head, logits, final norm) what remains. Raises ValueError for
        equal layer counts."""
        if other.layers == self.layers:
            raise ValueError(f"two different layer counts are needed to extrapolate, got {self.layers} twice")

        def line(a: int, b: int) -> int:
            per = (b - a) / (other.layers - self.layers)
            return round(a + (layers - self.layers) * per)

        return Measured(layers, *(line(getattr(self, k), getattr(other, k))
                                  for k in ("params", "grads", "optimizer", "activations", "flops")))


def _cpu_sdpa_flops():
    """FlopCounterMode ``custom_mapping`` for the CPU flash-attention ops (torch's sdpa formulas)."""
    aten = torch.ops.aten

    def fwd(q, k, v, *args, out_shape=None, **kwargs) -> int:
        return sdpa_flop_count(q, k, v)

    def bwd(grad_out, q, k, v, *args, out_shape=None, **kwargs) -> int:
        return sdpa_backward_flop_count(grad_out, q, k, v)

    return {aten._scaled_dot_product_flash_attention_for_cpu: fwd,
            aten._scaled_dot_product_flash_attention_for_cpu_backward: bwd}


def fake_step(config: dict, layers: int, rows: int, prompt: int, response: int, dtype: str = "bfloat16",
              gradient_checkpointing: bool = False) -> Measured:
    """Run one training micro-batch of the transformers model of ``config`` (a ``config.json`` dict with
    ``model_type``; ``num_hidden_layers`` replaced by ``layers``) under ``FakeTensorMode``: ``rows`` rows of
    ``prompt + response`` tokens, weights in ``dtype`` (``bfloat16`` or ``float32``), with transformers'
    non-reentrant gradient checkpointing when asked (as :func:`policyzoo.engine.trainer.modeling.
    enable_gradient_checkpointing` turns it on). Returns the :class:`Measured` bytes and FLOPs (module
    docstring). Raises ValueError for an unknown ``model_type`` (transformers')."""
    model = _build(config, layers, dtype, gradient_checkpointing)
    with FakeTensorMode(allow_non_fake_inputs=True):  # the meta parameters are the only real inputs
        model.to_empty(device="cpu")
        activations, flops = _forward_backward(model, rows, prompt, response)
        grads, optimizer = _optimizer_state(model)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return Measured(layers, params, grads, optimizer, activations, flops)


def _build(config: dict, layers: int, dtype: str, gradient_checkpointing: bool):
    """The causal LM of ``config`` with ``layers`` layers on the meta device, in eval mode (no dropout)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = {k: v for k, v in config.items() if k != "model_type"} | {"num_hidden_layers": layers}
    hf = AutoConfig.for_model(config["model_type"], **cfg)
    hf._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf, dtype=getattr(torch, dtype))
    model.eval()
    if gradient_checkpointing:
        enable_gradient_checkpointing(model)
    return model


def _forward_backward(model, rows: int, prompt: int, response: int) -> tuple[int, int]:
    """``(peak bytes beyond parameters and buffers, FLOPs)`` of the engine's per-row training forward and
    backward of ``rows`` rows (module docstring); full gradients dropped as accumulated (ZeRO 3). The FLOPs
    come from a second pass: ``FlopCounterMode``'s module hooks keep tensors that gradient checkpointing frees,
    so the two are never measured together."""
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
    tracker = MemTracker()
    with warnings.catch_warnings():  # it warns of each gradient that does not exist (yet, or any more: ZeRO 3)
        warnings.filterwarnings("ignore", "Expected a tensor or a traceable wrapper-subclass", UserWarning)
        tracker.track_external(model)
        with tracker:
            _step(model, rows, prompt, response)
    peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
    with FlopCounterMode(display=False, custom_mapping=_cpu_sdpa_flops()) as counter:
        _step(model, rows, prompt, response)
    return peak["Total"] - peak[_MemRefType.PARAM] - peak[_MemRefType.BUFFER], counter.get_total_flops()


def _step(model, rows: int, prompt: int, response: int) -> None:
    """Forward, fused log-probs of the ``response + 1`` last positions, a loss and backward, as the engine scores
    ``rows`` rows of ``prompt + response`` tokens (``policyzoo.engine.trainer.scoring``, per-row path)."""
    tokens = prompt + response
    attn = torch.ones(rows, tokens, dtype=torch.long)
    logits = model(input_ids=torch.zeros(rows, tokens, dtype=torch.long), attention_mask=attn,
                   position_ids=attn.cumsum(-1) - 1, logits_to_keep=response + 1).logits
    lp, _ = fused_token_logprobs(logits, torch.zeros(rows, response + 1, dtype=torch.long), 1.0, False)
    del logits  # the autograd graph keeps what it needs
    (-lp[:, :-1].sum()).backward()


def _optimizer_state(model) -> tuple[int, int]:
    """``(fp32 gradient bytes, optimizer bytes)`` of one AdamW step as DeepSpeed's optimizer holds it: fp32
    gradients, the two moments, and fp32 master weights when the model is not fp32."""
    master = [torch.nn.Parameter(torch.empty(p.shape, dtype=torch.float32)) for p in model.parameters()]
    for w in master:
        w.grad = torch.empty_like(w)
    opt = torch.optim.AdamW(master, foreach=False)
    tracker = MemTracker()
    tracker.track_external(*master)  # known before the step: its in-place updates are not new state
    with tracker:
        opt.step()
    state = next(iter(tracker.get_tracker_snapshot("current").values()))[_MemRefType.OPT]
    grads = sum(w.grad.numel() * w.grad.element_size() for w in master)
    fp32 = next(model.parameters()).dtype == torch.float32
    return grads, state + (0 if fp32 else sum(w.numel() * w.element_size() for w in master))


