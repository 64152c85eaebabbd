"""A learned reward model (a ``reward`` component)."""

from __future__ import annotations

import torch
from pydantic import Field

from policyzoo.contract import Reward, hookimpl
from policyzoo.contract.untrusted import affixes, encode_marked, mark_text, render_chat
from policyzoo.errors import ConfigError, UserError


class RewardModel(Reward):
    """A frozen transformers sequence-classification model as reward, ``[B]`` float32 (logits).

    ``path``: any local folder that ``AutoModelForSequenceClassification`` loads (weights are
    loaded once, lazily, at the first call; the folder is checked at construction). Input text:
    the row's chat ``prompt`` plus the completion as an assistant turn through the reward model's
    own chat template if it has one, else ``rollout.prompts[i] + completion``; the chat prompt's
    contents and the completion are untrusted text (special-token strings in them stay text, see
    ``policyzoo.contract.untrusted``). Sequences longer
    than ``max_length`` tokens are cut from the left (the end of the completion is kept); batches
    are right-padded (pad = eos if the tokenizer has no pad token). The score is the model's own
    pooled logit (transformers pools at the last non-pad token, as TRL's RewardTrainer trains it)
    for label ``label``; None requires a single-label model. No grad; eval mode; fp32.
    Errors: ``ConfigError`` for a missing folder, a folder that does not load, or a label that is
    not one of the model's; ``UserError`` when transformers is missing.
    Source: Ouyang et al. 2022, InstructGPT (arXiv:2203.02155) Sec. 3.5 (a scalar learned reward)."""

    name = "reward_model"
    binary = False  # a real-valued score: groups are never constant (policyzoo.equivalence's regime)

    class Params(Reward.Params):
        path: str = Field(..., description="local folder of a transformers sequence-classification model")
        batch_size: int = Field(8, ge=1, description="completions scored per forward pass")
        max_length: int = Field(1024, ge=1, description="tokens per scored sequence (cut from the left)")
        label: int | None = Field(None, ge=0, description="logit index to use; None = the single label")

    def __init__(self, **params):
        super().__init__(**params)
        import os

        self.where = f"reward: reward_model -> path {self.params.path}"
        if not os.path.isfile(os.path.join(self.params.path, "config.json")):
            raise ConfigError(self.where, "no such model folder (no config.json there)",
                              "point path at a folder written by save_pretrained")
        self.model = self.tokenizer = None

    def _load(self):
        try:
            from transformers import AutoModelForSequenceClassification, AutoTokenizer
        except ImportError:
            raise UserError("reward: reward_model", "the transformers package is not installed",
                            "pip install transformers") from None
        try:
            tok = AutoTokenizer.from_pretrained(self.params.path)
            model = AutoModelForSequenceClassification.from_pretrained(self.params.path, dtype=torch.float32)
        except Exception as e:
            raise ConfigError(self.where, f"cannot load a sequence-classification model: {type(e).__name__}: "
                              f"{str(e)[:200]}", "use a folder with a *ForSequenceClassification model") from None
        n, label = model.config.num_labels, self.params.label
        if (label is None and n != 1) or (label is not None and label >= n):
            raise ConfigError(f"{self.where} -> label", f"the model has {n} labels ({model.config.id2label}), "
                              f"label = {label}", f"set label to one of 0..{n - 1}")
        tok.truncation_side, tok.padding_side = "left", "right"
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        if model.config.pad_token_id is None:
            model.config.pad_token_id = tok.pad_token_id
        self.tokenizer, self.model = tok, model.eval().requires_grad_(False)

    def _ids(self, rollout, i: int) -> list[int]:
        """Row ``i``'s token ids, cut from the left to ``max_length`` (the tokenizer's own affixes,
        e.g. a BOS without a chat template, kept). Chat prompt contents and the completion are
        untrusted text (:mod:`policyzoo.contract.untrusted`): a completion that writes ``<|im_end|>`` as
        text cannot end its turn in the reward model's input."""
        tok, where = self.tokenizer, f"{self.where}, row {i}"
        row, completion = rollout.rows[i] if rollout.rows else {}, rollout.completions[i]
        if tok.chat_template and isinstance(row.get("prompt"), list):
            marked, (pre, post) = render_chat(tok, row["prompt"] + [{"role": "assistant", "content": completion}],
                                              where), ([], [])
        else:  # the prompt as the policy saw it (decoded), then the completion; without a template the BOS etc.
            marked = mark_text(tok, rollout.prompts[i], completion)
            pre, post = ([], []) if tok.chat_template else affixes(tok)
        core = encode_marked(tok, marked, False, where)
        keep = max(self.params.max_length - len(pre) - len(post), 0)
        return pre + core[max(len(core) - keep, 0):] + post if keep else pre + post

    @hookimpl
    def reward(self, rollout):
        if self.model is None:
            self._load()
        ids = [self._ids(rollout, i) for i in range(len(rollout))]
        step = self.params.batch_size if self.tokenizer.pad_token is not None else 1
        out = []
        with torch.no_grad():
            for lo in range(0, len(ids), step):
                enc = self.tokenizer.pad({"input_ids": ids[lo:lo + step]}, padding=step > 1, return_tensors="pt")
                logits = self.model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits
                out.append(logits[:, self.params.label or 0].float())
        return torch.cat(out) if out else torch.zeros(0)
