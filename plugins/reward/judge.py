"""LLM judges: an OpenAI-compatible chat endpoint scores responses (``llm_judge``: each response
alone against a prompt template; ``group_judge``: a group's responses side by side, scored
relative to each other). Requests go through :class:`~policyzoo.plugins.reward.remote.Endpoint`
(timeout, retries, concurrency limit, cache, the ``on_failure`` fallback).

Score parsing: ``score_pattern`` (a regular expression with one group) is searched in the judge's
reply and its **last** match is the score; the reward is ``score / max_score``. A reply without a
match is a failure (error, or NaN with ``on_failure: nan``). The judge is asked at
``temperature`` 0 by default so a cached reply is the reply.
"""

from __future__ import annotations

import os
import re

from pydantic import Field

from policyzoo.contract import Reward, hookimpl
from policyzoo.plugins.reward.remote import Endpoint, RemoteParams, RemoteRewardError, fallback

JUDGE_TEMPLATE = ("Rate the response to the question from 0 (wrong or useless) to 10 (correct and complete).\n\n"
                  "Question: {prompt}\n\nReference answer: {answer}\n\nResponse: {completion}\n\n"
                  "Reply with 'Score: <0-10>' only.")
GROUP_TEMPLATE = ("Compare these {n} responses to the question and rate each from 0 (worst) to 10 (best), "
                  "relative to each other.\n\nQuestion: {prompt}\n\nReference answer: {answer}\n\n{responses}\n\n"
                  "Reply with one line per response, '<number>: <score>', and nothing else.")


def question(prompt) -> str:
    """A data row's prompt as text: its last user message for chat messages."""
    if isinstance(prompt, list):
        users = [m.get("content", "") for m in prompt if m.get("role") == "user"]
        return users[-1] if users else ""
    return str(prompt)


class JudgeParams(RemoteParams):
    base_url: str = Field(..., pattern=r"^https?://", description="the OpenAI-compatible API root, e.g. "
                          "http://127.0.0.1:8000/v1 (POST {base_url}/chat/completions)")
    model: str = Field(..., description="the judge model's name on that server")
    system: str | None = Field(None, description="a system message for the judge (None: none)")
    score_pattern: str = Field(r"(-?\d+(?:\.\d+)?)", description="regex with one group: the last match in the "
                               "reply is the score")
    max_score: float = Field(10.0, gt=0, description="reward = score / max_score")
    temperature: float = Field(0.0, ge=0, description="the judge's sampling temperature")
    max_tokens: int = Field(32, ge=1, description="the judge's reply length limit")
    api_key_env: str | None = Field(None, description="name of the environment variable holding the API key, sent "
                                    "as 'Authorization: Bearer <key>' (None: no header; the key never enters the "
                                    "config or the logs)")
    extra_body: dict = Field({}, description="extra request fields sent as they are (e.g. a server's guided "
                             "decoding options)")


class _Judge(Reward):
    concurrent = True  # I/O-bound: runs beside the step's other concurrent rewards

    def __init__(self, **params):
        super().__init__(**params)
        p = self.params
        try:
            self.pattern = re.compile(p.score_pattern)
        except re.error as e:
            raise RemoteRewardError(f"reward: {self.name}.score_pattern", f"not a regular expression: {e}",
                                    "give a regex with one group, e.g. 'Score: (\\d+)'") from None
        key = os.environ.get(p.api_key_env) if p.api_key_env else None
        if p.api_key_env and not key:
            raise RemoteRewardError(f"reward: {self.name}.api_key_env", f"the environment variable {p.api_key_env} "
                                    "is not set", f"export {p.api_key_env}=<key>, or remove api_key_env")
        headers = {"authorization": f"Bearer {key}"} if key else None
        self.endpoint = Endpoint(p.base_url.rstrip("/") + "/chat/completions", p.timeout, p.retries,
                                 p.max_concurrency, p.cache_size, headers)

    def _payload(self, text: str) -> dict:
        p = self.params
        messages = ([{"role": "system", "content": p.system}] if p.system else []) + [{"role": "user", "content": text}]
        return {"model": p.model, "messages": messages, "temperature": p.temperature, "max_tokens": p.max_tokens,
                **p.extra_body}

    @staticmethod
    def _content(reply) -> str:
        """The reply's first choice's message content; raises KeyError/TypeError/IndexError if absent."""
        content = reply["choices"][0]["message"]["content"]
        if not isinstance(content, str):
            raise TypeError("message content is not text")
        return content

    @classmethod
    def _reply_text(cls, reply) -> str:
        """The text of one reply of the endpoint; re-raises the request's :class:`RemoteRewardError`
        and raises ValueError for a reply that is not a chat completion."""
        if isinstance(reply, RemoteRewardError):
            raise reply
        try:
            return cls._content(reply)
        except (KeyError, TypeError, IndexError):
            raise ValueError(f"not a chat completion: {str(reply)[:200]}") from None


class Judge(_Judge):
    """An LLM judge over an OpenAI-compatible chat API; ``[B]`` float32, ``score / max_score``.

    Each row is one chat request: ``template`` formatted with ``{prompt}`` (the row's question: the
    last user message of a chat prompt), ``{completion}`` and ``{answer}`` (the row's reference
    answer, "" when missing); the score is parsed from the reply (module docstring). Requests run
    concurrently (``max_concurrency``), replies are cached by request, failures follow
    ``on_failure`` (:mod:`policyzoo.plugins.reward.remote`).
    Source: LLM-as-a-judge (Zheng et al. 2023, arXiv:2306.05685); verl GenRM, TRL judges."""

    name = "llm_judge"

    class Params(JudgeParams):
        template: str = Field(JUDGE_TEMPLATE, description="the judge prompt: {prompt}, {completion}, {answer}")

    @hookimpl
    def reward(self, rollout):
        b, p = len(rollout), self.params
        rows = rollout.rows if len(rollout.rows) == b else [{} for _ in range(b)]
        texts = [p.template.format(prompt=question(r.get("prompt", "")), completion=c, answer=r.get("answer", ""))
                 for r, c in zip(rows, rollout.completions)]
        values, failures = [None] * b, []
        for i, reply in enumerate(self.endpoint.map([self._payload(t) for t in texts])):
            try:
                values[i] = self._score(reply)
            except RemoteRewardError as e:
                failures.append(e)
            except ValueError as e:
                failures.append(f"row {i}: {e}")
        return fallback(values, failures, p.on_failure, f"reward: llm_judge ({p.base_url}, {p.model})")

    def _score(self, reply) -> float:
        content = self._reply_text(reply)
        found = self.pattern.findall(content)
        if not found:
            raise ValueError(f"no score matching {self.params.score_pattern!r} in the judge's reply {content[:120]!r}")
        return float(found[-1]) / self.params.max_score


class GroupJudge(_Judge):
    """An LLM judge that scores a group's responses relative to each other; ``[B]`` float32.

    One chat request per group (rows sharing a group id: the samples of one prompt): ``template``
    formatted with ``{prompt}``, ``{answer}``, ``{n}`` and ``{responses}`` ("Response 1:\\n...",
    blank-line separated). The reply must hold a line ``<i>: <score>`` for every response i
    (1-based; the number is read with ``score_pattern``); the reward is ``score / max_score``. A
    reply missing a response fails the whole group (``on_failure``). Relative scores suit a group
    baseline (GRPO, RLOO) directly: only differences within a group reach the advantages.
    Source: OpenPipe ART's RULER (relative universal LLM-elicited rewards), ranking a group's
    trajectories with one judge call."""

    name = "group_judge"

    class Params(JudgeParams):
        template: str = Field(GROUP_TEMPLATE, description="the judge prompt: {prompt}, {answer}, {n}, {responses}")
        max_tokens: int = Field(128, ge=1, description="the judge's reply length limit")

    @hookimpl
    def reward(self, rollout):
        b, p = len(rollout), self.params
        rows = rollout.rows if len(rollout.rows) == b else [{} for _ in range(b)]
        groups = list(dict.fromkeys(rollout.group_ids.tolist()))
        members = [[i for i in range(b) if int(rollout.group_ids[i]) == g] for g in groups]
        texts = [p.template.format(prompt=question(rows[m[0]].get("prompt", "")), answer=rows[m[0]].get("answer", ""),
                                   n=len(m), responses="\n\n".join(f"Response {k + 1}:\n{rollout.completions[i]}"
                                                                   for k, i in enumerate(m))) for m in members]
        values, failures = [None] * b, []
        for m, reply in zip(members, self.endpoint.map([self._payload(t) for t in texts])):
            try:
                scores = self._scores(reply, len(m))
            except RemoteRewardError as e:
                failures.append(e)
                continue
            except ValueError as e:
                failures.append(f"group of rows {m}: {e}")
                continue
            for i, s in zip(m, scores):
                values[i] = s
        return fallback(values, failures, p.on_failure, f"reward: group_judge ({p.base_url}, {p.model})")

    def _scores(self, reply, n: int) -> list[float]:
        content = self._reply_text(reply)
        scores: dict[int, float] = {}
        for line in content.splitlines():
            head = re.match(r"\s*(?:response\s*)?(\d+)\s*[:.)\-]\s*(.*)", line, re.IGNORECASE)
            found = self.pattern.findall(head.group(2)) if head else []
            if head and found and 1 <= int(head.group(1)) <= n:
                scores.setdefault(int(head.group(1)), float(found[-1]) / self.params.max_score)
        missing = [k for k in range(1, n + 1) if k not in scores]
        if missing:
            raise ValueError(f"the judge's reply has no score for responses {missing}: {content[:160]!r}")
        return [scores[k] for k in range(1, n + 1)]

