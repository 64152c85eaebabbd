"""Example parameters and call context for components the contract suite cannot build from
defaults alone (a user function path, a reward-model folder) or cannot call without an engine
(``sample`` components get the tabular bandit as their policy)."""

from __future__ import annotations

from pathlib import Path

from .bandit import Bandit


def example_reward(prompts, completions, **columns):
    """A user reward for the contract suite: completion length in characters / 100 (TRL-style
    signature). Source: none, a test fixture."""
    return [len(c) / 100 for c in completions]


def tiny_reward_model(workdir: Path) -> dict:
    """Write a 1-layer Llama sequence-classification model and a word-level tokenizer into
    ``workdir/reward_model`` (random weights, ~50 kB) and return ``reward_model`` parameters."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForSequenceClassification, PreTrainedTokenizerFast

    path = Path(workdir) / "reward_model"
    if not (path / "config.json").exists():
        words = ["[PAD]", "[UNK]", "[EOS]", "What", "is", "The", "answer", "+", "?", "."]
        tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                       eos_token="[EOS]")
        fast.save_pretrained(path)
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=len(words), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=1, num_key_value_heads=1, num_labels=1, pad_token_id=0,
                          max_position_embeddings=64)
        LlamaForSequenceClassification(cfg).save_pretrained(path)
    return {"path": str(path), "max_length": 32}


#: (slot, name) -> callable(workdir) -> parameters, for built-ins that need them.
EXAMPLES = {
    ("reward", "function"): lambda workdir: {"function": "policyzoo.testing.examples:example_reward"},
    ("reward", "reward_model"): tiny_reward_model,
}


#: the data row an ``env`` component is reset from in the contract suite
ENV_ROW = {"prompt": [{"role": "system", "content": "Solve it."}, {"role": "user", "content": "What is 1 + 2?"}],
           "answer": "3"}


def context(slot: str):
    """``(policy, prompts)`` for a slot's call: a small bandit and 2 prompt rows for ``sample``;
    for ``env`` no policy and :data:`ENV_ROW`."""
    if slot == "env":
        return None, [dict(ENV_ROW)]
    if slot != "sample":
        return None, None
    bandit = Bandit([[2, 3, 4], [1, 5, 2]], [[True, False, False], [False, True, False]], seed=0)
    return bandit, bandit.prompts(2)
