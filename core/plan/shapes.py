"""Model shapes ``policyzoo plan --shape NAME`` knows without a model folder: the values of each model's
``config.json`` on the Hugging Face Hub that the planner reads (``policyzoo.plan.Shape.from_config``).

Parameter counts by the planner's convention (biases left out), worked by hand:

* qwen2.5-1.5b: 28 layers x (2*1536*1536 + 2*1536*256 + 3*1536*8960 + 2*1536) = 1,310,281,728, tied embedding
  151,936*1536 = 233,373,696, final norm 1536: 1,543,656,960 (the model card: 1.54B).
* qwen2.5-7b: 28 x (2*3584^2 + 2*3584*512 + 3*3584*18944 + 2*3584) = 6,525,489,152, untied 2*152,064*3584 =
  1,089,994,752, norm 3584: 7,615,487,488 (7.61B).
* llama-3.1-8b: 32 x (2*4096^2 + 2*4096*1024 + 3*4096*14336 + 2*4096) = 6,979,584,000, 2*128,256*4096 =
  1,050,673,152, norm 4096: 8,030,261,248 (8.03B).
* llama-3.1-70b: 80 x (2*8192^2 + 2*8192*1024 + 3*8192*28672 + 2*8192) = 68,452,352,000, 2*128,256*8192 =
  2,101,346,304, norm 8192: 70,553,706,496 (70.6B).
"""

from __future__ import annotations

from policyzoo.plan import PlanError

_QWEN = "https://huggingface.co/Qwen/{}/blob/main/config.json"
_LLAMA = "https://huggingface.co/meta-llama/{}/blob/main/config.json"

#: name -> (the config.json keys the planner reads, where they come from)
SHAPES: dict[str, tuple[dict, str]] = {
    "qwen2.5-1.5b": ({"model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                      "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936,
                      "tie_word_embeddings": True, "use_sliding_window": False}, _QWEN.format("Qwen2.5-1.5B-Instruct")),
    "qwen2.5-7b": ({"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                    "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                    "tie_word_embeddings": False, "use_sliding_window": False}, _QWEN.format("Qwen2.5-7B-Instruct")),
    "llama-3.1-8b": ({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                      "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                      "tie_word_embeddings": False}, _LLAMA.format("Llama-3.1-8B-Instruct")),
    "llama-3.1-70b": ({"model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
                       "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
                       "vocab_size": 128256, "tie_word_embeddings": False}, _LLAMA.format("Llama-3.1-70B-Instruct")),
}


def shape_config(name: str) -> tuple[dict, str]:
    """``(config dict, source)`` of a known shape. Raises :class:`~policyzoo.plan.PlanError` for an unknown name."""
    key = name.lower()
    if key not in SHAPES:
        raise PlanError(f"--shape {name}", "not a shape the planner knows", f"give one of {', '.join(SHAPES)}, or "
                        "model=PATH to a model folder or its config.json")
    return SHAPES[key]
