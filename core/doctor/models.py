"""The doctor's models, built in place from a config (random init, no download).

* the tiny Llama of :func:`policyzoo.testing.tiny.build_tiny_model` (2 layers, hidden 128, 4 heads,
  259-token byte tokenizer: ~0.1 M parameters), for the trainer subset;
* :data:`SHAPE_135M`, the shape of the default model SmolLM2-135M-Instruct (30 layers, hidden 576,
  vocabulary 49,152: 134.5 M parameters), for step time and memory per GPU. Its tokenizer is the
  byte tokenizer with filler entries up to 49,152 ids, so a sampled id above 258 still decodes.
"""

from __future__ import annotations

from pathlib import Path

from policyzoo.testing.tiny import build_tiny_model, build_tokenizer

#: SmolLM2-135M-Instruct's config.json (sizes, rope, ids: bos 1, eos = pad 2 as the byte tokenizer's)
SHAPE_135M = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
              "num_key_value_heads": 3, "vocab_size": 49152, "tie_word_embeddings": True,
              "max_position_embeddings": 8192, "rope_theta": 100000.0, "rms_norm_eps": 1e-5}


def build_tiny(folder: Path) -> Path:
    """The tiny Llama (fp32 safetensors, byte tokenizer) written to ``folder``; returns ``folder``."""
    return build_tiny_model(folder, seed=0)


#: the standard deviation of the random model's logits: its (tied) embedding is scaled so that a logit,
#: the dot product of the final RMS-normed hidden state (per-coordinate RMS 1) with an embedding row,
#: has variance hidden x (initializer_range x scale)^2 = LOGIT_STD^2. With the default init (0.02) the
#: 135M shape's logits have std 0.48: a near-uniform distribution over 49,152 ids whose log-probs bf16
#: barely moves (the first H200 run read a sync difference of 1e-6 nats), so the bf16 check tested nothing.
LOGIT_STD = 4.0


def build_shape(folder: Path, shape: dict = SHAPE_135M, seed: int = 0) -> Path:
    """A random-init Llama of ``shape`` (a config.json's sizes) saved in bf16 with its padded byte
    tokenizer into ``folder``; returns ``folder``. The embedding is scaled so the logits have standard
    deviation :data:`LOGIT_STD` (a peaked next-token distribution, as a trained model's). 135M shape:
    ~270 MB written, a few seconds."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(folder, shape["vocab_size"])
    config = LlamaConfig(**shape, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # tied: scales the input embedding and the output head together
        model.get_input_embeddings().weight.mul_(LOGIT_STD / (config.initializer_range * config.hidden_size ** 0.5))
    model = model.to(torch.bfloat16)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(str(folder), safe_serialization=True)
    return folder
