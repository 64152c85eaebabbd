"""LoRA through PEFT (``model.lora``): only low-rank adapters are trained; the rollout engine gets
merged weights.

* ``model.lora: {r, alpha, target_modules, dropout}`` builds a PEFT ``LoraConfig`` (PEFT's
  defaults: r 8, alpha 8, so the update ``B @ A`` is scaled by ``alpha / r``; ``target_modules``
  ``all-linear``: every linear layer but the LM head). DeepSpeed trains the adapter's parameters
  only (AdamW state for them alone); the base weights are frozen.
* **Sync.** vLLM is sent the merged weights ``W + scale * B @ A`` under the plain model's HF names
  (``merged_weights``; computed, never merged in place, so the base weights never pick up
  rounding from merge/unmerge), then the usual sync check compares vLLM with the trainer.
* **Reference.** With a ``kl`` component the reference is the base model itself: the adapter is
  switched off (PEFT's ``disable_adapter``) for the reference forward, so no second copy of the
  weights is loaded.
* **Dropout** applies in the gradient forwards only (the adapter's dropout modules are in training
  mode there and in eval mode otherwise): sampling, old log-probs and the sync check see the model
  without dropout.
* **Export**: ``final/`` holds the merged model (a plain transformers folder) and
  ``final/adapter/`` the adapter alone (PEFT's ``save_pretrained``: ``adapter_config.json``,
  ``adapter_model.safetensors``), loadable with ``PeftModel.from_pretrained(base, path)``.
"""

from __future__ import annotations

import contextlib

import torch

from policyzoo.errors import ConfigError


def wrap(model, settings, seed: int = 0):
    """``model`` with LoRA adapters (a PEFT model; base weights frozen). ``settings``: the config's
    ``model.lora`` section. PEFT draws ``A`` at random (``B`` starts at 0): the draw is seeded with
    ``seed`` (``train.seed``), so two runs of one config start from the same adapter. Raises
    ConfigError when a target module does not exist."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise ConfigError("model.lora", "LoRA needs the peft package, which is not installed",
                          "pip install 'policyzoo[lora]' (or peft), or drop model.lora") from None
    targets = settings.target_modules
    if not isinstance(targets, str) and "lm_head" in targets and getattr(model.config, "tie_word_embeddings", False):
        raise ConfigError("model.lora.target_modules", "lm_head is tied to the input embeddings in this model: an "
                          "adapter on it cannot be merged into the one shared weight vLLM holds",
                          "leave lm_head out (all-linear already does)")
    cfg = LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout, bias="none",
                     target_modules=targets if isinstance(targets, str) else list(targets), task_type="CAUSAL_LM")
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return get_peft_model(model, cfg)
    except ValueError as e:
        raise ConfigError("model.lora.target_modules", str(e).splitlines()[0],
                          "name linear layers of the model (e.g. [q_proj, v_proj]) or use all-linear") from None


def _lora_layers(peft_model) -> dict:
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in peft_model.get_base_model().named_modules() if isinstance(m, LoraLayer)}


def merged_weights(peft_model):
    """A generator of ``(hf_name, tensor)``: the base model's parameters under their plain HF names,
    each adapted weight replaced by ``W + delta`` (PEFT's ``get_delta_weight``, i.e. ``scale * B @ A``,
    for every active adapter); the adapter's own parameters left out. Each merged weight is computed
    when the consumer asks for it, so the sync holds one merged copy at a time, not a merged model."""
    layers = _lora_layers(peft_model)
    for name, p in peft_model.get_base_model().named_parameters():
        if ".lora_" in name:
            continue
        if ".base_layer." not in name:
            yield name, p.data
            continue
        owner, _, leaf = name.partition(".base_layer.")
        t = p.data
        if leaf == "weight":
            layer = layers[owner]
            with torch.no_grad():
                for adapter in layer.active_adapters:
                    if adapter in layer.lora_A:
                        t = t + layer.get_delta_weight(adapter).to(t.dtype)
        yield f"{owner}.{leaf}", t


@contextlib.contextmanager
def adapter_dropout(peft_model, on: bool):
    """The adapter's dropout modules in training mode inside (when ``on``), eval mode after."""
    mods = [d for layer in _lora_layers(peft_model).values() for d in layer.lora_dropout.values()] if on else []
    for d in mods:
        d.train()
    try:
        yield
    finally:
        for d in mods:
            d.eval()


def trainable_count(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def export(peft_model, folder: str, tokenizer) -> None:
    """The merged model to ``folder`` and the adapter to ``folder/adapter`` (safetensors)."""
    state = {n: t.detach().cpu().clone() for n, t in merged_weights(peft_model)}
    peft_model.get_base_model().save_pretrained(folder, state_dict=state, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    peft_model.save_pretrained(f"{folder}/adapter", safe_serialization=True)
