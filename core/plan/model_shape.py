"""A model's shape for ``policyzoo plan``: the sizes of a decoder-only transformer read from its
``config.json`` (:class:`Shape`, :func:`load_shape`), and the parameters, FLOPs and activations they give
by the conventions of :mod:`policyzoo.plan`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from policyzoo.errors import UserError

#: model types whose MLP is two matrices (up, down) rather than gated (gate, up, down)
UNGATED = {"gpt2", "gpt_neox", "gptj", "opt", "bloom", "phi", "starcoder2", "gpt_bigcode", "falcon"}
#: the embedded default (SmolLM2-135M-Instruct)'s config.json, so a plan needs no conversion
DEFAULT_CONFIG = {"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                  "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
                  "tie_word_embeddings": True}


class PlanError(UserError):
    """The model config or the sizes given to ``policyzoo plan`` cannot be planned."""


@dataclass(frozen=True)
class Shape:
    """The sizes of a decoder-only transformer that its costs depend on."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    gated: bool
    window: int | None = None

    @classmethod
    def from_config(cls, cfg: dict, where: str = "config.json") -> "Shape":
        """From a transformers ``config.json`` dict (Llama/Qwen/Mistral keys, GPT-2 aliases)."""
        cfg = {**cfg, **cfg.get("text_config", {})}

        def get(*keys, default=None):
            for k in keys:
                if cfg.get(k) is not None:
                    return cfg[k]
            if default is None:
                raise PlanError(where, f"none of {', '.join(keys)} is set", "give the config.json of a "
                                "decoder-only transformers model")
            return default

        h = int(get("hidden_size", "n_embd", "d_model"))
        heads = int(get("num_attention_heads", "n_head"))
        return cls(hidden=h, intermediate=int(get("intermediate_size", "n_inner", "ffn_dim", default=4 * h)),
                   layers=int(get("num_hidden_layers", "n_layer")), heads=heads,
                   kv_heads=int(get("num_key_value_heads", "num_attention_heads", "n_head")),
                   head_dim=int(get("head_dim", default=h // heads)), vocab=int(get("vocab_size")),
                   tied=bool(cfg.get("tie_word_embeddings", True)), gated=cfg.get("model_type") not in UNGATED,
                   window=cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None)

    @property
    def dq(self) -> int:
        return self.heads * self.head_dim

    @property
    def dkv(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_matmul(self) -> int:
        """Matmul parameters of one layer."""
        h = self.hidden
        return 2 * h * self.dq + 2 * h * self.dkv + (3 if self.gated else 2) * h * self.intermediate

    @property
    def params(self) -> int:
        emb = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * (self.layer_matmul + 2 * self.hidden) + emb + self.hidden

    def context_sum(self, offset: int, n: int) -> int:
        """Sum of attended positions over ``n`` tokens that follow ``offset`` earlier ones (each
        attends to itself and what precedes it, up to the window)."""
        def s(m):  # sum_{c=1..m} min(c, window)
            w = self.window
            return m * (m + 1) // 2 if w is None or m <= w else w * (w + 1) // 2 + (m - w) * w
        return s(offset + n) - s(offset)

    def forward(self, tokens: int, offset: int = 0, logits: int = 0, head: bool = True) -> int:
        """FLOPs of a forward over ``tokens`` positions after ``offset`` cached ones, with logits at
        ``logits`` of them (``head=False``: a value model, 2*h per position instead)."""
        body = 2 * self.layers * self.layer_matmul * tokens + 4 * self.layers * self.dq * self.context_sum(offset,
                                                                                                            tokens)
        return body + (2 * self.hidden * self.vocab * logits if head else 2 * self.hidden * tokens)

    def lora_params(self, r: int, targets: str | list[str] = "all-linear") -> int:
        """Adapter parameters: ``r x (in + out)`` per adapted linear layer (Llama names; all-linear:
        every linear layer of the decoder, not the LM head)."""
        h, i = self.hidden, self.intermediate
        shapes = {"q_proj": (h, self.dq), "k_proj": (h, self.dkv), "v_proj": (h, self.dkv), "o_proj": (self.dq, h),
                  "up_proj": (h, i), "down_proj": (i, h)} | ({"gate_proj": (h, i)} if self.gated else {})
        names = list(shapes) if targets == "all-linear" else [t for t in targets if t in shapes]
        return self.layers * sum(r * sum(shapes[n]) for n in names)

    def recompute(self, tokens: int) -> int:
        """FLOPs of re-running ``tokens`` positions' layers under gradient checkpointing: torch's non-reentrant
        checkpoint stops once the last tensor saved for backward is rebuilt (``early_stop``), so each layer's
        last matmul (the MLP's down projection, ``h x i``) and the LM head are not run again."""
        return (2 * self.layers * (self.layer_matmul - self.hidden * self.intermediate) * tokens
                + 4 * self.layers * self.dq * self.context_sum(0, tokens))

    def norm_bytes(self, b: int) -> int:
        """Bytes one RMSNorm keeps for backward per token (see :mod:`policyzoo.plan`): its fp32 input
        (``4h``), the normalised value cast back (``b h``), the scaled output (``b h``), ``rsqrt`` (4)."""
        return 4 * self.hidden + 2 * b * self.hidden + 4

    def act_bytes(self, b: int, context: int) -> int:
        """Bytes one layer keeps for backward per token, weights of ``b`` bytes, rows of ``context``
        tokens (see :mod:`policyzoo.plan`)."""
        attention = 4 * b * self.dq + 4 * self.heads + b * context
        return 2 * self.norm_bytes(b) + attention + (4 if self.gated else 2) * b * self.intermediate


def load_shape(model: str | None) -> Shape:
    """``model``: a folder with ``config.json``, a ``config.json`` file, or None (the default)."""
    if model is None:
        return Shape.from_config(DEFAULT_CONFIG, "the embedded default")
    p = Path(model)
    f = p / "config.json" if p.is_dir() else p
    if not f.is_file():
        raise PlanError(f"model={model}", "no config.json there", "give a model folder or its config.json file")
    try:
        cfg = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise PlanError(str(f), f"not readable as JSON ({e})", "give the model's config.json") from None
    return Shape.from_config(cfg, str(f))
