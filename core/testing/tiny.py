"""A tiny Llama and byte-level tokenizer, built locally (no downloads), for tests and smoke runs.

``build_tiny_model(folder)`` writes a transformers causal-LM folder that vLLM and DeepSpeed load
like any other: Llama architecture, hidden 128, 4 heads (head_dim 32, the smallest head size the
vLLM CPU attention backend supports), 2 layers, tied embeddings (as SmolLM2), a ChatML chat
template and ``eos == pad == <|im_end|>`` (as SmolLM2: nothing may assume pad != eos).
The tokenizer is byte-level BPE with no merges: every byte is one token, so any text encodes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] "
          "+ '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
          "{% endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def build_tokenizer(folder: str | Path, vocab_size: int | None = None):
    """Byte-level tokenizer (256 byte tokens + 3 specials) saved to ``folder``; returns it. With
    ``vocab_size``: filler tokens ``x259``, ``x260``, ... up to that many ids (encoding never yields
    one, decoding one gives its text), for a model shape with a larger vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIAL)}
    for ch in sorted(byte_chars):
        vocab[ch] = len(vocab)
    while len(vocab) < (vocab_size or 0):
        vocab[f"x{len(vocab)}"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   pad_token="<|im_end|>", unk_token="<|endoftext|>")
    fast.chat_template = CHATML
    fast.save_pretrained(str(folder))
    return fast


def build_tiny_model(folder: str | Path, seed: int = 0, layers: int = 2, hidden: int = 128,
                     heads: int = 4, max_positions: int = 1024) -> Path:
    """Write a randomly initialised tiny Llama (fp32 safetensors) and its tokenizer to ``folder``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(folder)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads // 2,
                         max_position_embeddings=max_positions, tie_word_embeddings=True,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, torch_dtype="float32")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(str(folder), safe_serialization=True)
    return folder



def spread_reward(prompts, completions, **columns) -> list[float]:
    """A smoke-test reward that differs between almost any two samples, even of a random model:
    the number of distinct characters of a completion divided by its length plus one. Use as
    ``rewards: [{use: function, function: "policyzoo.testing.tiny:spread_reward"}]``."""
    return [len(set(c)) / (len(c) + 1) for c in completions]


async def async_spread_reward(prompts, completions, **columns) -> list[float]:
    """:func:`spread_reward` as a coroutine function that first waits 0.2 s (as a remote verifier
    would): the engine test of async rewards. Use as ``function: "policyzoo.testing.tiny:async_spread_reward"``."""
    await asyncio.sleep(0.2)
    return spread_reward(prompts, completions)
