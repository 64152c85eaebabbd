"""Multi-turn episodes: the loop that alternates model turns and environment answers, token-exact.

:func:`run_episodes` starts B = P x n episodes (the env's ``env(row)`` reset, once per sample),
then repeats, at most ``max_turns`` times: one model turn for every live episode -- all of them
in one batched call of the policy's ``generate_tokens``, each with its own seed -- then
``Episode.step`` on each turn, whose answer is rendered with the chat template and appended.

Token layout of one row (the Rollout's response): ``turn_1 env_1 turn_2 env_2 ... turn_k``.
``turn_i`` are the model's tokens exactly as sampled (EOS included when generated) with their
sampler log-probs and ``response_mask`` True; ``env_i`` are the tokens of the environment's
messages in the chat template -- what the template puts after the model's turn -- with mask False
and log-prob 0. Nothing is decoded and re-tokenised: the next turn is sampled from the
concatenated ids, so trainer and sampler see the same sequence.

Environment tokens (:func:`env_turn_ids`): the conversation ``[system, user, assistant: X] +
messages`` is rendered with ``add_generation_prompt=True``; the text after the assistant content X
is the environment's part, minus the end-of-turn token the model already generated (the EOS text
right after X). It is tokenised alone; chat templates end a message with a special token, so the
boundary never merges with the model's tokens. The messages' contents are untrusted text
(:mod:`policyzoo.contract.untrusted`): a special-token string in a tool result stays text, so the result
cannot end its turn or write a fake assistant turn; only the template's structure gives control tokens.

Budgets: a model turn may use ``min(max_tokens, max_total_tokens - tokens so far)`` tokens.
An episode ends when the env says ``done`` (or answers nothing) -- stop reason ``env`` -- when the
turn budget is spent while the env still answers (``turns``), or when the env's answer would
leave no room for another model token (``tokens``; that answer is not appended). ``truncated``
is True for ``turns`` and ``tokens``, and when the last model turn hit its token limit without EOS.

Failures (the env's ``on_error`` and ``step_timeout``): a ``step`` call that raises or runs longer
than ``step_timeout`` seconds (it runs in a daemon thread, which is abandoned: a Python call cannot
be cancelled, so a tool that may hang should run in a subprocess with its own limit, as
``python_sandbox`` does) is a failure. ``stop``: the run stops with a :class:`ComponentError`
naming the env. ``retry(k)``: ``step`` is called again with the same turn, at most k more times
(the Episode must tolerate that), then the run stops. ``drop_group``: the episode ends with stop
reason ``error`` or ``timeout``, its ``reward()`` is not called (NaN), and the step drops every
row of its group (:func:`failed_groups`), so no group trains with a biased subset of its
samples. Metrics: ``env_error_frac`` (episodes ended by a failure, timeouts included) and
``env_timeout_frac`` (by a timeout), over the sampled episodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from policyzoo.contract import Episode, Rollout
from policyzoo.contract.untrusted import encode_chat, encode_marked, encode_text, render_chat
from policyzoo.errors import ComponentError, ConfigError, DataError, UserError

from .env_answer import env_answer

__all__ = ["EPISODE_METRICS", "FAILED", "DrivesEpisodes", "encode_prompt", "env_turn_ids", "episode_sums",
           "failed_groups", "run_episodes", "score_sums", "turn_seed"]

SEED_MOD = 2**62
#: per-step means over the sampled episodes, reported when the run has an env
EPISODE_METRICS = ("env_turns_mean", "env_tool_calls_mean", "env_tool_errors_mean", "env_tool_call_frac",
                   "env_truncated_turns_frac", "env_truncated_tokens_frac", "env_error_frac", "env_timeout_frac")
FAILED = ("error", "timeout")  # stop reasons of an episode ended by a failing step (on_error: drop_group)
_SENTINEL = "\u2063policyzoo-turn\u2063"  # marks the assistant content in env_turn_ids


def encode_prompt(tokenizer, prompt, where: str = "data (a prompt)", error: type[UserError] | None = None) -> list[int]:
    """Token ids of one prompt: chat messages go through the tokenizer's chat template with the
    generation prompt appended; a plain string is tokenized as is (with the tokenizer's BOS, if it
    adds one). The prompt is untrusted text (:mod:`policyzoo.contract.untrusted`): special-token
    strings in a message's content or in a plain string stay text, only the template's structure
    gives control tokens; without such strings the ids are those of ``apply_chat_template(prompt,
    add_generation_prompt=True, tokenize=True)`` / ``tokenizer(prompt)``. Raises ``error``
    (default :class:`~policyzoo.errors.DataError`) at ``where`` when a message's role (or any field
    but its content) holds a special-token string."""
    error = error or DataError
    if isinstance(prompt, str):
        return encode_text(tokenizer, prompt, True, where, error)
    return encode_chat(tokenizer, list(prompt), where, error)


def env_turn_ids(tokenizer, messages: list[dict], eos_generated: bool,
                 where: str = "env (Observation.messages)") -> list[int]:
    """Token ids that follow a model turn when the environment answers with ``messages``: the
    chat template's end of the assistant turn (unless the model generated it: ``eos_generated``,
    its last token is the tokenizer's ``eos_token``; another stop id keeps the template's),
    the messages, and the generation prompt of the next assistant turn (see the module docstring).
    The messages' contents are untrusted text (:mod:`policyzoo.contract.untrusted`): a special-token string
    in them stays text, so a tool result cannot end its turn or write a fake assistant turn.
    Raises :class:`ConfigError` when the template does not reproduce the assistant's content, and
    :class:`ComponentError` at ``where`` when a message's role (or any field but its content)
    holds a special-token string."""
    base = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
            {"role": "assistant", "content": _SENTINEL}]
    marked = render_chat(tokenizer, base + list(messages), where, ComponentError, trusted=len(base),
                         add_generation_prompt=True)
    if _SENTINEL not in marked.raw or _SENTINEL not in marked.bound:
        raise ConfigError("env (chat template)", "the model's chat template does not render an assistant message's "
                          "content verbatim, so environment turns cannot be placed after it",
                          "use a model whose chat template renders assistant messages (e.g. ChatML)")
    rest = marked.after(_SENTINEL)
    if eos_generated:
        rest = rest.drop_prefix(tokenizer.eos_token or "")
    return encode_marked(tokenizer, rest, False, where, ComponentError)


def episode_sums(rollout: Rollout) -> dict[str, float]:
    """Sums over the rows of ``rollout`` of the :data:`EPISODE_METRICS` (divide by the row count
    for the means); empty for a single-turn rollout."""
    if rollout.turns is None:
        return {}
    reasons = rollout.stop_reasons or []
    return {"env_turns_mean": float(rollout.turns.sum()), "env_tool_calls_mean": float(rollout.tool_calls.sum()),
            "env_tool_errors_mean": float(rollout.tool_errors.sum()),
            "env_tool_call_frac": float((rollout.tool_calls > 0).sum()),
            "env_truncated_turns_frac": float(sum(r == "turns" for r in reasons)),
            "env_truncated_tokens_frac": float(sum(r == "tokens" for r in reasons)),
            "env_error_frac": float(sum(r in FAILED for r in reasons)),
            "env_timeout_frac": float(sum(r == "timeout" for r in reasons)),
            **score_sums(rollout.env_scores or [])}


def score_sums(scores: list[dict[str, float]]) -> dict[str, float]:
    """``{"env_score/<name>": sum}`` over the episodes' ``Episode.scores`` (an episode without the
    name adds 0), for means over the episodes like the other :data:`EPISODE_METRICS`."""
    out: dict[str, float] = {}
    for row in scores:
        for name, value in row.items():
            out[f"env_score/{name}"] = out.get(f"env_score/{name}", 0.0) + float(value)
    return out


def failed_groups(rollout: Rollout) -> torch.Tensor:
    """``[B]`` bool, True on every row of a group in which an episode ended by a failure (stop reason
    ``error`` or ``timeout``, see the module docstring): the step drops these whole groups."""
    reasons = rollout.stop_reasons or []
    bad = [g for g, r in zip(rollout.group_ids.tolist(), reasons) if r in FAILED]
    return torch.isin(rollout.group_ids, torch.tensor(bad, dtype=torch.long))


@dataclass
class _Trace:
    """One episode in progress: its prompt ids and the response built so far."""

    episode: Episode
    prompt: list[int]
    seed: int
    ids: list[int] = field(default_factory=list)
    model: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_rewards: dict[int, float] = field(default_factory=dict)
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    stop: str = ""
    cut: bool = False  # the last model turn hit its token limit without EOS

    def add(self, ids: list[int], logprobs: list[float] | None) -> None:
        self.ids += ids
        self.model += [logprobs is not None] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)


def turn_seed(seed: int, prompt_index: int, n: int, sample: int, turn: int) -> int:
    """The sampling seed of model turn ``turn`` of sample ``sample`` of the prompt with global index
    ``prompt_index``: distinct for every (prompt, sample, turn) of a step, the same on any number
    of data-parallel ranks."""
    return (((seed * 1_000_003 + prompt_index) * n + sample) * 1_009 + turn) % SEED_MOD


def run_episodes(policy, env, rows: list[dict], n: int, max_tokens: int, temperature: float, seed: int,
                 top_p: float = 1.0, **options) -> Rollout:
    """``n`` episodes of ``env`` per row of ``rows``, as a Rollout of B = len(rows) x n rows
    (row ``i * n + j`` is sample ``j`` of prompt ``i``, group id ``first_index + i``).

    ``policy`` must have ``tokenizer``, ``pad_token_id`` and ``generate_tokens`` (see
    :class:`policyzoo.contract.TokenPolicy`); ``first_index`` (default 0) is the global index of
    ``rows[0]``. ``options``: the other sampling options (top_k, min_p, repetition_penalty, stop),
    passed to every ``generate_tokens`` call. Raises :class:`ComponentError` when the env's
    ``env(row)`` does not return an :class:`Episode`, its ``step`` fails (``on_error: stop``) or
    returns something else than an :class:`Observation`, or its ``reward`` is not a number."""
    tok, first = policy.tokenizer, getattr(policy, "first_index", 0)
    budget, max_turns = env.params.max_total_tokens, env.params.max_turns
    traces = _start(env, rows, n, tok, seed, first)
    for turn in range(max_turns):
        live = [t for t in traces if not t.stop]
        if not live:
            break
        outs = policy.generate_tokens([t.prompt + t.ids for t in live],
                                      [min(max_tokens, budget - len(t.ids)) for t in live], temperature,
                                      [t.seed + turn for t in live], top_p=top_p, **options)
        for t, out in zip(live, outs):
            _take_turn(env, t, out, turn == max_turns - 1, budget, tok)
    return _pack(env, traces, rows, n, policy.pad_token_id, tok, temperature, max_tokens, first)


def _start(env, rows: list[dict], n: int, tok, seed: int, first: int) -> list[_Trace]:
    """The ``len(rows) x n`` episodes (``env.env(row)``, once per sample), their prompts encoded and their
    seeds set; raises :class:`ComponentError` when ``env(row)`` raises TypeError or returns no Episode."""
    traces: list[_Trace] = []
    for i, row in enumerate(rows):
        for j in range(n):
            try:
                ep = env.env(row)
            except TypeError as e:  # e.g. an Episode subclass without step() or reward()
                raise ComponentError(f"env component {env!r}", f"env(row) raised TypeError: {e}",
                                     "implement step(turn_text, turn_ids) and reward() on the Episode "
                                     "subclass it returns") from e
            if not isinstance(ep, Episode):
                raise ComponentError(f"env component {env!r}", f"env(row) returned {type(ep).__name__}, not an "
                                     "Episode", "return an instance of a policyzoo.Episode subclass")
            traces.append(_Trace(ep, encode_prompt(tok, ep.prompt, f"env component {env!r}, Episode.prompt",
                                                 ComponentError), turn_seed(seed, first + i, n, j, 0)))
    return traces


def _take_turn(env, t: _Trace, out, last: bool, budget: int, tok) -> None:
    """Append the model turn ``out`` (ids, log-probs, ``stopped``) to ``t``, then the env's answer, or end the
    episode (stop reason ``env``, ``turns`` when ``last``, ``tokens`` past ``budget``; module docstring)."""
    t.add(list(out.ids), list(out.logprobs))
    t.turns += 1
    t.cut = not out.stopped
    obs = env_answer(env, t, out.text, list(out.ids))
    if obs is None:  # a failed step under on_error: drop_group
        return
    if obs.reward is not None and out.ids:
        t.turn_rewards[len(t.ids) - 1] = float(obs.reward)
    t.tool_calls += int(obs.tool_call)
    t.tool_errors += int(obs.tool_error)
    if obs.done or not obs.messages:
        t.stop = "env"
    elif last:
        t.stop = "turns"
    else:
        ended = bool(out.ids) and out.ids[-1] == tok.eos_token_id  # the template's end-of-turn token
        answer = env_turn_ids(tok, obs.messages, eos_generated=ended,
                              where=f"env component {env!r}, Observation.messages")
        if len(t.ids) + len(answer) >= budget:
            t.stop = "tokens"
        else:
            t.add(answer, None)


class DrivesEpisodes:
    """Mixin of a :class:`~policyzoo.contract.TokenPolicy`: ``run_episodes`` = :func:`run_episodes` on
    this engine (its ``tokenizer``, ``pad_token_id`` and ``generate_tokens``)."""

    def run_episodes(self, env, rows: list[dict], n: int, max_tokens: int, temperature: float, seed: int,
                     top_p: float = 1.0, **options) -> Rollout:
        return run_episodes(self, env, rows, n, max_tokens, temperature, seed, top_p=top_p, **options)


def _pack(env, traces: list[_Trace], rows, n, pad_id, tok, temperature, max_tokens, first) -> Rollout:
    b, t = len(traces), max([len(x.ids) for x in traces] + [1])
    ids = torch.full((b, t), pad_id, dtype=torch.long)
    mask = torch.zeros((b, t), dtype=torch.bool)
    lps = torch.zeros((b, t), dtype=torch.float32)
    turn_rewards = torch.zeros((b, t), dtype=torch.float32)
    rewards = torch.zeros(b, dtype=torch.float32)
    for k, x in enumerate(traces):
        ids[k, :len(x.ids)] = torch.tensor(x.ids, dtype=torch.long)
        mask[k, :len(x.ids)] = torch.tensor(x.model, dtype=torch.bool)
        lps[k, :len(x.ids)] = torch.tensor(x.logprobs, dtype=torch.float32)
        for pos, r in x.turn_rewards.items():
            turn_rewards[k, pos] = r
        r = math.nan if x.stop in FAILED else x.episode.reward()  # a failed episode is not scored
        if not isinstance(r, (int, float)) or isinstance(r, bool):
            raise ComponentError(f"env component {env!r}", f"Episode.reward() returned {type(r).__name__}",
                                 "return a float (NaN = unscorable)")
        rewards[k] = float(r)
    return Rollout(prompt_ids=[x.prompt for x in traces], response_ids=ids, response_mask=mask,
                   rollout_logprobs=lps, group_ids=torch.arange(first, first + len(rows)).repeat_interleave(n),
                   truncated=torch.tensor([x.stop in ("turns", "tokens") or x.cut for x in traces], dtype=torch.bool),
                   prompts=[tok.decode(x.prompt) for x in traces],
                   completions=[tok.decode(x.ids, skip_special_tokens=True) for x in traces],
                   rows=[r for r in rows for _ in range(n)], temperature=temperature, max_tokens=max_tokens,
                   env_rewards=rewards, turn_rewards=turn_rewards,
                   turns=torch.tensor([x.turns for x in traces], dtype=torch.long),
                   tool_calls=torch.tensor([x.tool_calls for x in traces], dtype=torch.long),
                   tool_errors=torch.tensor([x.tool_errors for x in traces], dtype=torch.long),
                   stop_reasons=[x.stop for x in traces],
                   env_scores=[dict(getattr(x.episode, "scores", None) or {}) for x in traces])  # after reward()
