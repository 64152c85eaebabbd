"""The tensors that cross hook boundaries.

Shapes: B rows = P prompts x G samples, T response tokens (right-padded). ``response_mask`` is
True on generated tokens that count for the loss. Rows are never reordered by policyzoo; grouping
always uses ``group_ids``, never row position.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor


@dataclass
class Rollout:
    """What a ``sample`` component returns: G responses per prompt.

    Attributes:
        prompt_ids: list of B token-id lists (the prompt of each row, unpadded).
        response_ids: ``[B, T]`` long, right-padded with the pad id.
        response_mask: ``[B, T]`` bool, True on generated tokens (EOS included when generated).
        rollout_logprobs: ``[B, T]`` float, per-token log-probabilities reported by the sampler
            (nats), 0 on padding. May differ slightly from the trainer's (engine mismatch).
        group_ids: ``[B]`` long; rows with the same id answered the same prompt.
        truncated: ``[B]`` bool, True when the response hit the token limit without EOS.
        prompts / completions: B strings (the prompt text and the decoded response).
        rows: B dicts, the data row each prompt came from (answer and any extra columns).
        temperature: the sampling temperature; the trainer scales logits by it.
        greedy: ``[B]`` bool or None; True on the greedy (temperature 0) baseline rows a sample
            component with ``greedy`` adds (the step removes them after the reward).
        policy_lag: ``[B]`` long or None: optimizer steps between the weights that sampled each row
            and the weights it trains (``engine.overlap``, ``engine.max_staleness``: its staleness;
            None when sampling is never ahead).
        policy_version: ``[B]`` long or None: the version (weight pushes since step 0) that sampled
            each row (``engine.max_staleness``).
        max_tokens: the response token limit the sampler used (L_max).

    Episode fields (None for single-turn rollouts; set by a sampler driving an ``env``): the
    response is the trajectory after the prompt, model and environment tokens interleaved exactly
    as generated, ``response_mask`` False and ``rollout_logprobs`` 0 on environment tokens.
        env_rewards: ``[B]`` float, each episode's final reward (``Episode.reward()``), read by the
            ``env_reward`` component.
        turn_rewards: ``[B, T]`` float, per-turn rewards on the last token of their model turn, 0
            elsewhere; ``policyzoo.step.prepare`` adds them to ``token_rewards``.
        turns / tool_calls / tool_errors: ``[B]`` long, model turns, tool calls and failed tool
            calls per episode.
        stop_reasons: B strings, why each episode ended: ``env`` (the environment stopped it),
            ``turns`` (turn budget), ``tokens`` (token budget), ``error`` / ``timeout`` (a failing
            ``Episode.step`` under the env's ``on_error: drop_group``; the step drops the group).
        env_scores: B dicts, each episode's named scores (``Episode.scores``, e.g. a verifiers
            rubric's functions), reported as ``env_score/<name>``; None for single-turn sampling.

    ``host_mask``: ``[B, T]`` bool on the host, a copy of ``response_mask`` that :meth:`to` keeps when
    it moves the tensors to an accelerator, so that work planned from the lengths (length groups,
    token-budget chunks) reads the host and never waits on a device-to-host copy; None otherwise
    (:meth:`mask_on_host` then reads ``response_mask``).
    """

    prompt_ids: list[list[int]]
    response_ids: Tensor
    response_mask: Tensor
    rollout_logprobs: Tensor
    group_ids: Tensor
    truncated: Tensor
    prompts: list[str] = field(default_factory=list)
    completions: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    temperature: float = 1.0
    max_tokens: int = 0
    greedy: Tensor | None = None
    policy_lag: Tensor | None = None
    policy_version: Tensor | None = None
    env_rewards: Tensor | None = None
    turn_rewards: Tensor | None = None
    turns: Tensor | None = None
    tool_calls: Tensor | None = None
    tool_errors: Tensor | None = None
    stop_reasons: list[str] | None = None
    env_scores: list[dict[str, float]] | None = None
    host_mask: Tensor | None = None

    def __len__(self) -> int:
        return int(self.response_ids.shape[0])

    def prompt_excerpt(self, i: int, width: int = 80) -> str:
        """The first ``width`` characters of row ``i``'s own question, for messages: the content
        of the last user message of its data row's chat prompt, or the last paragraph of a plain
        text prompt (not the system prompt and few-shot examples every row shares); else the
        prompt text."""
        prompt = self.rows[i].get("prompt") if i < len(self.rows) else None
        if isinstance(prompt, list):
            users = [m.get("content", "") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
            if users:
                return str(users[-1])[:width]
        if isinstance(prompt, str) and prompt.strip():
            return prompt.strip().split("\n\n")[-1][:width]
        return str(self.prompts[i])[:width] if i < len(self.prompts) else ""

    def to(self, device) -> "Rollout":
        """A copy with every tensor on ``device`` (lists and numbers shared, not copied) and the
        host copy of ``response_mask`` kept in ``host_mask``. The copies are host-to-device only."""
        host = self.host_mask if self.host_mask is not None else self.response_mask
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        moved = {k: v.to(device) for k, v in values.items() if isinstance(v, Tensor) and k != "host_mask"}
        return Rollout(**{**values, **moved, "host_mask": host if host.device.type == "cpu" else None})

    def mask_on_host(self) -> Tensor:
        """``response_mask`` on the host: ``host_mask`` when :meth:`to` kept it, else ``response_mask``
        (copied to the host when it lives elsewhere)."""
        return self.host_mask if self.host_mask is not None else self.response_mask.cpu()

    def select(self, keep: Tensor) -> "Rollout":
        """Rows where ``keep [B]`` is True, in their original order."""
        return _select(self, keep)

    @staticmethod
    def concat(parts: list["Rollout"]) -> "Rollout":
        """Stack rollouts row-wise; T is padded to the widest part."""
        return _concat(parts)


@dataclass
class StepBatch:
    """A rollout plus everything the loss needs, for one optimizer step (or one micro-batch of it).

    All tensors are ``[B, T]`` or ``[B]`` and aligned with ``rollout``'s rows.
    ``old_logprobs`` are the trainer's log-probs at sampling time (no grad); ``ref_logprobs`` the
    reference model's (only when a ``kl`` component is active); ``values`` the critic's (only for
    critic baselines). ``rewards`` is the weighted sum of reward components (NaN = unscorable);
    ``reward_components [B, K]`` each component's own values (None: ``rewards`` is the only one);
    ``greedy_rewards [B]`` the reward of the greedy response to each row's prompt (None: no greedy).
    """

    rollout: Rollout
    rewards: Tensor
    old_logprobs: Tensor | None = None
    ref_logprobs: Tensor | None = None
    values: Tensor | None = None
    token_rewards: Tensor | None = None
    advantages: Tensor | None = None
    returns: Tensor | None = None
    reward_components: Tensor | None = None
    greedy_rewards: Tensor | None = None
    sum_pi_squared: Tensor | None = None

    @property
    def response_mask(self) -> Tensor:
        return self.rollout.response_mask

    def __len__(self) -> int:
        return len(self.rollout)

    def select(self, keep: Tensor) -> "StepBatch":
        return _select(self, keep)

    def to(self, device) -> "StepBatch":
        """A copy with every tensor, and the rollout's (:meth:`Rollout.to`), on ``device``."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        moved = {k: v.to(device) if isinstance(v, (Tensor, Rollout)) else v for k, v in values.items()}
        return StepBatch(**moved)

    def split(self, n_micro: int) -> list["StepBatch"]:
        """Split rows into ``n_micro`` contiguous micro-batches (order kept)."""
        b = len(self)
        bounds = [round(i * b / n_micro) for i in range(n_micro + 1)]
        out = []
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            keep = torch.zeros(b, dtype=torch.bool)
            keep[lo:hi] = True
            out.append(self.select(keep))
        return out

    def split_tokens(self, budget: int) -> list["StepBatch"]:
        """Contiguous micro-batches of at most ``budget`` tokens each, a row counting its prompt and
        its real response tokens (``response_mask``; padding is not counted), as the per-row
        forward would feed them (:func:`token_budget_bounds`). The loss is exact for any split
        (``StepTotals``), so this only bounds the activations held at once."""
        lengths = self.rollout.mask_on_host().sum(-1).tolist()
        costs = [len(p) + int(n) for p, n in zip(self.rollout.prompt_ids, lengths)]
        out = []
        for lo, hi in token_budget_bounds(costs, budget):
            keep = torch.zeros(len(self), dtype=torch.bool)
            keep[lo:hi] = True
            out.append(self.select(keep))
        return out


def token_budget_bounds(costs: list[int], budget: int) -> list[tuple[int, int]]:
    """Contiguous ``[lo, hi)`` row ranges, each holding at most ``budget`` tokens (``costs[i]``:
    row i's tokens), filled greedily in row order; a row alone over the budget gets a range of its
    own (a row is never cut). Row order is kept, so a group's rows (and the prompt they share)
    stay together unless the budget ends between them."""
    bounds, lo, used = [], 0, 0
    for i, c in enumerate(costs):
        if i > lo and used + c > budget:
            bounds.append((lo, i))
            lo, used = i, 0
        used += c
    if costs:
        bounds.append((lo, len(costs)))
    return bounds


def _select(obj, keep: Tensor):
    keep = keep.to(torch.bool).cpu()
    idx = keep.nonzero().flatten().tolist()
    b = int(keep.shape[0])
    values = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if isinstance(v, (Rollout, StepBatch)):
            v = _select(v, keep)
        elif isinstance(v, Tensor) and v.dim() >= 1 and v.shape[0] == b:  # rows by host index: no device sync
            v = v[torch.tensor(idx, dtype=torch.long, device=v.device)]
        elif isinstance(v, list) and len(v) == b:
            v = [v[i] for i in idx]
        values[f.name] = v
    return type(obj)(**values)


def _pad_to(t: Tensor, width: int, value) -> Tensor:
    if t.dim() < 2 or t.shape[1] == width:
        return t
    pad = torch.full((t.shape[0], width - t.shape[1]), value, dtype=t.dtype, device=t.device)
    return torch.cat([t, pad], dim=1)


def _concat(parts: list[Rollout]) -> Rollout:
    if len(parts) == 1:
        return parts[0]
    width = max(p.response_ids.shape[1] for p in parts)
    pads = {"response_ids": 0, "response_mask": False, "host_mask": False}  # other [B, T] fields pad with 0.0
    values: dict[str, Any] = {}
    for f in dataclasses.fields(Rollout):
        got = [getattr(p, f.name) for p in parts]
        if f.name in ("temperature", "max_tokens"):
            values[f.name] = got[0]
        elif f.name == "greedy":  # rows of parts without greedy rows are not greedy
            values[f.name] = None if all(v is None for v in got) else torch.cat(
                [v if v is not None else torch.zeros(len(p), dtype=torch.bool) for v, p in zip(got, parts)])
        elif any(v is None for v in got):  # an episode field absent from some part is absent
            values[f.name] = None
        elif isinstance(got[0], Tensor):
            values[f.name] = torch.cat([_pad_to(v, width, pads.get(f.name, 0.0)) for v in got])
        else:
            values[f.name] = [x for v in got for x in v]
    return Rollout(**values)
