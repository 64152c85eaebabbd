"""A deterministic toy batch with ragged masks, for testing components without a model.

``toy_batch()`` returns a :class:`ToyBatch`: B = 6 rows (P = 2 prompts x G = 3 samples,
interleaved so that grouping by position would be wrong), T = 5 response tokens, and every
tensor a step hook can receive. Response lengths are ``[5, 3, 1, 4, 0, 2]``: row 4 has no
trainable token (it must not enter any statistic). Values at masked positions are deliberately
*not* zero (a component that forgets the mask shows it), but finite.

Everything is built from a seeded ``torch.Generator``: the same call gives the same numbers on
every machine. ``logprobs`` is a fresh leaf with ``requires_grad=True`` on every call.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from policyzoo.contract.batch import Rollout
from policyzoo.contract.ground import LOCAL, StepTotals

LENGTHS = (5, 3, 1, 4, 0, 2)
GROUP_IDS = (7, 3, 7, 3, 7, 3)  # two prompts, rows interleaved, ids not 0..P-1
REWARDS = (1.0, 0.0, 0.0, 1.0, 1.0, 0.0)


@dataclass
class ToyBatch:
    """Every argument a step hook can take, aligned on B rows and T tokens.

    Shapes: ``logprobs``, ``old_logprobs``, ``rollout_logprobs``, ``ref_logprobs``, ``values``,
    ``token_rewards``, ``advantages``, ``loss`` are ``[B, T]`` float32 (``logprobs`` and ``loss``, a
    per-token loss for ``reduce``, are leaves that require grad); ``response_mask [B, T]``
    bool; ``rewards [B]`` float32; ``group_ids [B]`` long; ``totals`` the step's counts;
    ``reward_components [B, 1]`` (the rewards as the only component), ``reward_weights [1]`` and
    ``greedy_rewards [B]`` (0.5: the reward of a greedy response to each row's prompt) and
    ``sum_pi_squared [B, T]`` (in [0.05, 0.9] on valid positions).
    ``advantages`` are sequence advantages broadcast over T and 0 on masked positions.
    """

    rollout: Rollout
    logprobs: Tensor
    old_logprobs: Tensor
    rollout_logprobs: Tensor
    ref_logprobs: Tensor
    response_mask: Tensor
    rewards: Tensor
    group_ids: Tensor
    advantages: Tensor
    values: Tensor
    token_rewards: Tensor
    loss: Tensor
    totals: StepTotals
    reward_components: Tensor
    reward_weights: Tensor
    greedy_rewards: Tensor
    sum_pi_squared: Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.response_mask.shape)

    def hook_kwargs(self) -> dict:
        """All hook argument names -> values (``ratio`` is the token ratio of the batch; ``entropy``
        the one-sample entropy estimate -logprobs, so it carries the gradient of ``logprobs``)."""
        kw = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        kw["ratio"] = torch.exp(self.logprobs - self.old_logprobs)
        kw["entropy"] = -self.logprobs
        kw["policy"], kw["prompts"], kw["seed"], kw["collective"] = None, [], 0, LOCAL
        return kw

    def clone(self) -> "ToyBatch":
        """A deep copy; ``logprobs`` stays a leaf that requires grad."""
        values = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Tensor):
                v = v.detach().clone().requires_grad_(v.requires_grad)
            elif isinstance(v, Rollout):
                v = dataclasses.replace(v, response_ids=v.response_ids.clone(),
                                        response_mask=v.response_mask.clone(),
                                        rollout_logprobs=v.rollout_logprobs.clone(),
                                        group_ids=v.group_ids.clone(), truncated=v.truncated.clone(),
                                        rows=[dict(r) for r in v.rows])
            values[f.name] = v
        return ToyBatch(**values)


def ragged_mask(lengths, width: int | None = None) -> Tensor:
    """``[B, T]`` bool, True on the first ``lengths[b]`` tokens of each row."""
    width = max(lengths) if width is None else width
    return torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]


def toy_batch(seed: int = 0, lengths=LENGTHS, group_ids=GROUP_IDS, rewards=REWARDS,
              width: int | None = None) -> ToyBatch:
    """The deterministic toy batch (see the module docstring). ``lengths``, ``group_ids`` and
    ``rewards`` (one per row) may be changed; ``width`` defaults to ``max(lengths)``."""
    g = torch.Generator().manual_seed(seed)
    b = len(lengths)
    mask = ragged_mask(lengths, width)
    t = mask.shape[1]

    def uniform(lo, hi, shape=(b, t)):
        return lo + (hi - lo) * torch.rand(shape, generator=g)

    old = uniform(-3.0, -0.05)
    logprobs = (old + uniform(-0.1, 0.1)).clamp(max=-1e-3)
    rollout_lp = torch.where(mask, old + uniform(-0.05, 0.05), torch.zeros(b, t))  # 0 on padding
    ref = old + uniform(-0.2, 0.2)
    # Masked positions hold finite garbage far from the valid values.
    junk = torch.full((b, t), -17.0)
    logprobs = torch.where(mask, logprobs, junk + 9.0)
    old = torch.where(mask, old, junk)
    ref = torch.where(mask, ref, junk + 4.0)
    r = torch.tensor(rewards, dtype=torch.float32)
    gid = torch.tensor(group_ids, dtype=torch.long)
    adv = _group_advantages(r, gid, mask)
    ids = torch.randint(3, 50, (b, t), generator=g) * mask
    rollout = _toy_rollout(ids, mask, rollout_lp, gid, lengths, rewards, r)
    return ToyBatch(
        rollout=rollout,
        logprobs=logprobs.detach().requires_grad_(True),
        old_logprobs=old,
        rollout_logprobs=rollout_lp,
        ref_logprobs=ref,
        response_mask=mask,
        rewards=r,
        group_ids=gid,
        advantages=adv,
        values=torch.where(mask, uniform(-1.0, 1.0), torch.full((b, t), 3.0)),
        token_rewards=torch.zeros(b, t),
        loss=torch.where(mask, uniform(-2.0, 2.0), torch.full((b, t), 11.0)).requires_grad_(True),
        totals=StepTotals(tokens=int(mask.sum()), sequences=int((mask.sum(-1) > 0).sum()), rows=b),
        reward_components=r.clone().unsqueeze(-1),
        reward_weights=torch.ones(1),
        greedy_rewards=torch.full((b,), 0.5),
        sum_pi_squared=torch.where(mask, uniform(0.05, 0.9), torch.full((b, t), 7.0)),
    )


def _group_advantages(r: torch.Tensor, gid: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` population-std group advantages of the rewards ``r [B]`` by ``gid [B]``, for a realistic
    scale; 0 on masked positions (the baseline contract)."""
    b, t = mask.shape
    seq_adv = torch.zeros(b)
    for gi in gid.unique():
        sel = (gid == gi) & (mask.sum(-1) > 0)
        x = r[sel]
        seq_adv[sel] = (x - x.mean()) / (x.std(unbiased=False) + 1e-6)
    adv = torch.where(mask, seq_adv[:, None].expand(b, t), torch.full((b, t), 5.0))
    return adv * mask


def _toy_rollout(ids, mask, rollout_lp, gid, lengths, rewards, r) -> Rollout:
    """The toy batch's :class:`Rollout`: ``ids``, ``mask``, ``rollout_lp`` ``[B, T]``; prompts ``What is g + 1?``
    per group id ``g``, completions right where the row's reward is truthy."""
    b, t = mask.shape
    return Rollout(
        prompt_ids=[[1, 2, int(x)] for x in gid.tolist()],
        response_ids=ids.long(),
        response_mask=mask.clone(),
        rollout_logprobs=rollout_lp,
        group_ids=gid.clone(),
        truncated=torch.tensor([n == t for n in lengths]) if t else torch.zeros(b, dtype=torch.bool),
        prompts=[f"What is {int(x)} + 1?" for x in gid.tolist()],
        completions=[f"The answer is {int(x) + 1 if ok else 0}." for x, ok in zip(gid.tolist(), rewards)],
        rows=[{"prompt": f"What is {int(x)} + 1?", "answer": str(int(x) + 1)} for x in gid.tolist()],
        temperature=1.0,
        max_tokens=t,
        env_rewards=r.clone(),  # as an env would report them (read by env_reward)
    )
