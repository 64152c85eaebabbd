"""A bandit test bed: a tabular policy that plugs into the real training step.

The model
---------
M questions, each with K candidate answers. Candidate k of question q has a token length
``lengths[q, k]`` and a score ``scores[q, k]`` (1.0 right, 0.0 wrong, NaN unscorable). The policy
is a softmax over K learnable logits per question (``theta [M, K]``, one ``torch.nn.Parameter``).
A sampled response is the chosen candidate's L tokens:

* the first token is the choice: its token id is k and its log-probability is
  ``log_softmax(theta[q] / temperature)[k]`` (with grad);
* the remaining L - 1 tokens are deterministic given the choice: log-probability exactly 0, no
  parameters, entropy 0.

So ``logprobs [B, T]`` is non-zero only in column 0, and the sequence log-probability equals the
choice's. Every per-token weighting a reduce applies (1/|o|, 1/C, 1/tokens) lands on the choice
logit unchanged, which is what makes length effects of the reduces visible in a few seconds.
``response_mask`` is True on the L tokens, right-padded to T = min(max L, max_tokens); a candidate
with L > max_tokens is cut at max_tokens tokens and flagged ``truncated``.

Sampler and trainer are kept apart as in the real engine: ``generate`` samples from a copy of the
logits that :meth:`Bandit.sync` refreshes, so with several updates per batch the sampler is stale
until the sync, exactly like vLLM between weight pushes. The reference log-probs come from a
frozen copy of the initial logits; ``values`` from a tabular critic ``V [M, T]`` (one scalar per
question per token position, its own optimizer), so critic baselines (``gae``) run too.

Rewards
-------
The reward is the component ``bandit_correct`` defined here (slot ``reward``). Each prompt row the
bandit hands out carries its question's ``scores`` (K floats), like a data set row carries its
answer; the component reads the choice from the first response token and returns
``scores[k]`` (0 for a truncated response: it never reached its final answer, as a verifier would
score it). It is registered with ``load_catalog(extra=[policyzoo.testing.bandit])``; :func:`bandit_run`
does both steps. This keeps the reward a pure function of the rollout (no reference to the
policy object) and needs no change to the built-in reward components.

Training: :func:`train` runs the real step N times in-process; :func:`step_settings` builds its
settings.

Reproducibility: the initial logits, the prompt stream and every ``generate`` call are seeded
(``seed`` argument and the ``generate`` seed), so two bandits built alike give identical runs.
"""

from __future__ import annotations

import sys
from typing import Callable

import torch
from torch import Tensor

from policyzoo.assembly import assemble
from policyzoo.catalog import load_catalog
from policyzoo.contract import LOCAL, Reward, Rollout, hookimpl, use
from policyzoo.errors import ConfigError, DataError
from policyzoo.step import StepSettings, train_step

__all__ = ["Bandit", "BanditCorrect", "bandit_catalog", "bandit_run", "step_settings", "train"]


def _table(x, name: str, dtype) -> Tensor:
    t = torch.as_tensor(x, dtype=dtype)
    if t.dim() != 2 or t.shape[0] < 1 or t.shape[1] < 1:
        raise ConfigError(f"Bandit({name}=...)", f"{name} must be a non-empty [M, K] table, got shape "
                          f"{tuple(t.shape)}", "pass one row of K values per question")
    return t


class Bandit:
    """Tabular softmax policy over K candidates per question; implements :class:`policyzoo.contract.Policy`.

    Args:
        lengths: ``[M, K]`` ints >= 1, token length of each candidate.
        correct: ``[M, K]`` bools (right/wrong); ignored where ``scores`` is given.
        scores: optional ``[M, K]`` floats (NaN = unscorable); default ``correct`` as 1.0/0.0.
        logits: optional initial ``[M, K]`` logits; default zeros (uniform).
        lr: policy learning rate; ``optimizer``: ``"adam"`` or ``"sgd"`` (plain, no momentum).
        critic_lr: learning rate of the tabular critic (same optimizer kind).
        seed: seeds the prompt stream.
    Raises: :class:`~policyzoo.errors.ConfigError` for malformed tables or settings.
    """

    def __init__(self, lengths, correct=None, *, scores=None, logits=None, lr: float = 0.1,
                 optimizer: str = "adam", critic_lr: float = 0.1, seed: int = 0):
        self.lengths = _table(lengths, "lengths", torch.long)
        if scores is None:
            if correct is None:
                raise ConfigError("Bandit(...)", "neither correct nor scores given", "pass correct=[[...]]")
            scores = _table(correct, "correct", torch.bool).float()
        self.scores = _table(scores, "scores", torch.float32)
        init = torch.zeros(self.scores.shape) if logits is None else _table(logits, "logits", torch.float32)
        if not (self.lengths.shape == self.scores.shape == init.shape):
            raise ConfigError("Bandit(...)", f"table shapes differ: lengths {tuple(self.lengths.shape)}, "
                              f"scores {tuple(self.scores.shape)}, logits {tuple(init.shape)}",
                              "give every table M rows of K candidates")
        if int(self.lengths.min()) < 1:
            raise ConfigError("Bandit(lengths=...)", "a candidate has fewer than 1 token", "lengths >= 1")
        if optimizer not in ("adam", "sgd") or not lr > 0 or not critic_lr > 0:
            raise ConfigError("Bandit(optimizer/lr)", f"optimizer={optimizer!r}, lr={lr}, critic_lr={critic_lr}",
                              "optimizer is 'adam' or 'sgd'; learning rates > 0")
        self.M, self.K = self.scores.shape
        self.theta = torch.nn.Parameter(init.clone())
        self.ref_theta = init.clone()  # frozen reference
        self.sampler_theta = init.clone()  # what generate samples from; refreshed by sync()
        self.critic = torch.nn.Parameter(torch.zeros(self.M, int(self.lengths.max())))
        opt = torch.optim.Adam if optimizer == "adam" else torch.optim.SGD
        self.opt = opt([self.theta], lr=lr)
        self.critic_opt = opt([self.critic], lr=critic_lr)
        self._prompt_gen = torch.Generator().manual_seed(seed)
        self._next_group = 0

    @classmethod
    def random(cls, questions: int, candidates: int, right: int, min_len: int = 2, max_len: int = 20,
               seed: int = 0, **kwargs) -> "Bandit":
        """``right`` of the ``candidates`` of each question are right (uniform start: accuracy
        right / candidates); lengths uniform in [min_len, max_len], drawn with ``seed``."""
        if not 0 <= right <= candidates:
            raise ConfigError("Bandit.random(right=...)", f"right={right} of {candidates} candidates",
                              "0 <= right <= candidates")
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(min_len, max_len + 1, (questions, candidates), generator=g)
        correct = torch.zeros(questions, candidates, dtype=torch.bool)
        for q in range(questions):
            correct[q, torch.randperm(candidates, generator=g)[:right]] = True
        return cls(lengths, correct, seed=seed, **kwargs)

    # ------------------------------------------------------------------ observation
    def probs(self, temperature: float = 1.0) -> Tensor:
        """Current trainer policy ``[M, K]``."""
        return torch.softmax(self.theta.detach() / temperature, -1)

    def expected_reward(self) -> float:
        """Mean over questions of sum_k pi(k|q) x score (NaN scores count as 0; no truncation)."""
        return float((self.probs() * self.scores.nan_to_num(0.0)).sum(-1).mean())

    def accuracy(self) -> float:
        """Mean over questions of the probability of a right (score 1) answer."""
        return float((self.probs() * (self.scores == 1.0)).sum(-1).mean())

    def prompts(self, n: int) -> list[dict]:
        """``n`` prompt rows, questions drawn uniformly with replacement from the seeded stream.
        Row keys: ``prompt`` (text), ``question`` (int), ``scores`` (K floats, read by
        ``bandit_correct``)."""
        qs = torch.randint(0, self.M, (n,), generator=self._prompt_gen).tolist()
        return [{"prompt": f"question {q}", "question": q, "scores": self.scores[q].tolist()} for q in qs]

    # ------------------------------------------------------------------ Policy protocol
    def generate(self, prompts: list[dict], n: int, max_tokens: int, temperature: float, seed: int) -> Rollout:
        """B = len(prompts) x n rows (prompt-major); ``group_ids`` unique across calls.
        Raises :class:`~policyzoo.errors.DataError` for a prompt row without a valid ``question``."""
        bad = [p for p in prompts if not (isinstance(p.get("question"), int) and 0 <= p["question"] < self.M)]
        if bad:
            raise DataError("Bandit.generate(prompts=...)", f"prompt row {bad[0]!r} has no question id in "
                            f"0..{self.M - 1}", "feed the bandit rows from Bandit.prompts(n)")
        q = torch.tensor([int(p["question"]) for p in prompts for _ in range(n)], dtype=torch.long)
        logp = torch.log_softmax(self.sampler_theta[q] / (temperature or 1.0), -1)
        gen = torch.Generator().manual_seed(int(seed))
        k = (torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1) if temperature > 0
             else logp.argmax(-1))  # temperature 0: greedy
        full = self.lengths[q, k]
        length = full.clamp(max=max_tokens)
        width = int(min(int(self.lengths.max()), max_tokens))
        pos = torch.arange(width)
        mask = pos[None, :] < length[:, None]
        ids = torch.where(mask, torch.full_like(mask, self.K, dtype=torch.long), 0)
        ids[:, 0] = k
        rollout_lp = torch.zeros(len(q), width)
        rollout_lp[:, 0] = logp.gather(1, k[:, None]).squeeze(1)
        groups = torch.arange(len(prompts)).repeat_interleave(n) + self._next_group
        self._next_group += len(prompts)
        return Rollout(
            prompt_ids=[[int(x)] for x in q], response_ids=ids, response_mask=mask,
            rollout_logprobs=rollout_lp, group_ids=groups, truncated=full > max_tokens,
            prompts=[p["prompt"] for p in prompts for _ in range(n)],
            completions=[f"answer {int(c)}" + (" [truncated]" if int(L) > max_tokens else "") for c, L in zip(k, full)],
            rows=[dict(p) for p in prompts for _ in range(n)], temperature=temperature, max_tokens=max_tokens)

    def _token_logprobs(self, theta: Tensor, rollout: Rollout, entropy: bool,
                        entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
        q = torch.tensor([ids[0] for ids in rollout.prompt_ids], dtype=torch.long)
        k = rollout.response_ids[:, 0]
        logp = torch.log_softmax(theta[q] / rollout.temperature, -1)
        width = rollout.response_ids.shape[1]
        first = logp.gather(1, k[:, None])
        out = torch.cat([first, first.new_zeros(len(q), width - 1)], 1)
        ent = None
        if entropy:
            h = -(logp.exp() * logp).sum(-1, keepdim=True)
            ent = torch.cat([h, h.new_zeros(len(q), width - 1)], 1)
            ent = ent if entropy_grad else ent.detach()  # grad only when a loss term needs it
        return out, ent

    def logprobs(self, rollout: Rollout, *, grad: bool, entropy: bool = False,
                 entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
        """``[B, T]``: column 0 the choice's log-prob (grad when asked), 0 elsewhere; entropy
        ``[B, T]`` of the choice distribution in column 0, 0 elsewhere (deterministic tokens),
        with grad only with ``entropy_grad`` (and ``grad``)."""
        with torch.set_grad_enabled(grad):
            return self._token_logprobs(self.theta, rollout, entropy, entropy_grad)

    def ref_logprobs(self, rollout: Rollout) -> Tensor:
        """``[B, T]`` under the frozen initial logits."""
        return self._token_logprobs(self.ref_theta, rollout, False)[0]

    def sum_pi_squared(self, rollout: Rollout) -> Tensor:
        """``[B, T]``: column 0 sum_k pi(k)^2 of the choice distribution at the sampling temperature,
        1 on the deterministic filler tokens, 0 where the mask is False."""
        q = torch.tensor([ids[0] for ids in rollout.prompt_ids], dtype=torch.long)
        p = torch.softmax(self.theta.detach()[q] / rollout.temperature, -1)
        out = torch.ones(rollout.response_ids.shape)
        out[:, 0] = (p * p).sum(-1)
        return torch.where(rollout.response_mask, out, torch.zeros_like(out))

    def values(self, rollout: Rollout, *, grad: bool) -> Tensor:
        """``[B, T]``: the critic's ``V[q, t]`` for each row's question and position."""
        q = torch.tensor([ids[0] for ids in rollout.prompt_ids], dtype=torch.long)
        width = rollout.response_ids.shape[1]
        with torch.set_grad_enabled(grad):
            return self.critic[q, :width] if grad else self.critic.detach()[q, :width].clone()

    def backward(self, loss: Tensor, value_loss: Tensor | None = None) -> None:
        total = loss if value_loss is None else loss + value_loss
        if total.requires_grad:
            total.backward()

    def optimizer_step(self, skip: bool = False) -> dict:
        """Adam/SGD step on the logits and the critic, then zero the gradients. With ``skip``, or
        when any gradient is non-finite, the gradients are discarded and weights and optimizer
        state stay as they were: returns ``{"skipped": 1}``. Otherwise ``{"skipped": 0,
        "grad_norm": L2 norm of the logits' gradient}``."""
        grads = [p.grad for p in (self.theta, self.critic) if p.grad is not None]
        out: dict = {"skipped": 0}
        if skip or not all(bool(torch.isfinite(g).all()) for g in grads):
            out["skipped"] = 1
        else:
            out["grad_norm"] = float(self.theta.grad.norm()) if self.theta.grad is not None else 0.0
            self.opt.step()
            self.critic_opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.critic_opt.zero_grad(set_to_none=True)
        return out

    collective = LOCAL  # one process
    sampling_options: frozenset[str] = frozenset()  # temperature only: no top_p, top_k, ... (see SAMPLING_OPTIONS)

    def reduce_totals(self, totals):
        """One process: the step's totals are already global."""
        return totals

    def sync(self) -> dict:
        """Copy the trained logits into the sampler; reports the largest logit change pushed."""
        change = float((self.theta.detach() - self.sampler_theta).abs().max())
        self.sampler_theta = self.theta.detach().clone()
        return {"sync_max_change": change}


class BanditCorrect(Reward):
    """Reward ``scores[k]`` of the chosen candidate (1 right, 0 wrong, NaN unscorable); 0 when
    the response was truncated. Returns ``rewards [B]`` float. Reads ``rollout.rows[i]["scores"]``
    (set by :meth:`Bandit.prompts`) and the first response token (the choice k)."""

    name = "bandit_correct"

    @hookimpl
    def reward(self, rollout):
        k = rollout.response_ids[:, 0].tolist()
        out = torch.tensor([float(row["scores"][c]) for row, c in zip(rollout.rows, k)])
        return torch.where(rollout.truncated, torch.zeros_like(out), out)


@hookimpl
def register_components(register):
    register(BanditCorrect)


def bandit_catalog():
    """The built-in catalog (no entry points) plus ``bandit_correct``."""
    return load_catalog(autoload=False, extra=[sys.modules[__name__]])


def bandit_run(algorithm, catalog=None):
    """``assemble(algorithm)`` with ``bandit_correct`` as the task reward."""
    return assemble(algorithm, rewards=(use("bandit_correct"),), catalog=catalog or bandit_catalog())


# ----------------------------------------------------------------------------- the real step, N times
def step_settings(run, **overrides):
    """:class:`~policyzoo.step.StepSettings` from the run's components plus ``overrides``."""
    return StepSettings.for_run(run, **overrides)


def train(run, bandit, steps: int, prompts_per_step: int = 8, seed: int = 0, settings=None,
          on_step: Callable[[int, dict], None] | None = None, threads: int | None = 1) -> list[dict]:
    """Run ``steps`` calls of :func:`policyzoo.step.train_step` on ``bandit`` (a
    :class:`~policyzoo.testing.bandit.Bandit`; step i uses seed ``seed * 1_000_000 + i``); returns each
    step's metrics plus ``accuracy`` and ``expected_reward`` after the step. ``threads``: torch intra-op
    threads for the run, restored after (default 1: the tensors are tiny and extra threads only add
    overhead, ~8x slower on 2 busy cores); None leaves the setting alone."""
    settings = settings or step_settings(run)
    saved = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    history = []
    try:
        for i in range(steps):
            m = train_step(run, bandit, lambda: bandit.prompts(prompts_per_step), seed=seed * 1_000_000 + i,
                           settings=settings)
            m.update(accuracy=bandit.accuracy(), expected_reward=bandit.expected_reward())
            history.append(m)
            if on_step is not None:
                on_step(i, m)
    finally:
        torch.set_num_threads(saved)
    return history
