"""Rewards computed by a server: a served reward model or verifier over HTTP (``remote_reward``),
and the HTTP plumbing the LLM judges share (:mod:`policyzoo.plugins.reward.judge`).

Every request goes through :class:`Endpoint`: httpx (``pip install policyzoo[remote]``; vLLM
installs it too), a per-request ``timeout`` (seconds), ``retries`` more attempts after a
connection error, a timeout or a 5xx/429 reply (backoff 0.5 s, 1 s, 2 s ...; a 4xx reply is not
retried), at most ``max_concurrency`` requests in flight, and an optional cache of replies by
request body. A request that still fails, or a reply that cannot be read, raises
:class:`RemoteRewardError` naming the URL -- or, with ``on_failure: nan``, makes the rows it
covered unscorable (NaN: they enter no statistic) and warns once per call with the count.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
import warnings
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

import torch
from pydantic import Field

from policyzoo.contract import Reward, hookimpl
from policyzoo.errors import UserError


class RemoteRewardError(UserError):
    """A reward server was unreachable, too slow, or answered something unreadable."""


class Endpoint:
    """POST JSON to one URL with timeout, retries, a concurrency limit and a reply cache."""

    def __init__(self, url: str, timeout: float, retries: int, max_concurrency: int, cache_size: int,
                 headers: dict | None = None):
        try:
            import httpx
        except ImportError:
            raise RemoteRewardError(f"reward endpoint {url}", "httpx is not installed",
                                    "pip install 'policyzoo[remote]' (or httpx)") from None
        self.url, self.timeout, self.retries = url, timeout, retries
        self.client = httpx.Client(timeout=timeout, headers=headers or {})
        self.pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="policyzoo-remote")
        self.cache: OrderedDict[str, object] = OrderedDict()
        self.cache_size, self.lock, self.httpx = cache_size, threading.Lock(), httpx
        self.requests = 0  # sent over the network (cache hits not counted)

    def post(self, payload: dict):
        """The decoded JSON reply to ``payload``; raises :class:`RemoteRewardError`."""
        body = json.dumps(payload, sort_keys=True)
        key = hashlib.sha256(body.encode()).hexdigest()
        with self.lock:
            if key in self.cache:
                self.cache.move_to_end(key)
                return self.cache[key]
        reply = self._send(body)
        if self.cache_size:
            with self.lock:
                self.cache[key] = reply
                while len(self.cache) > self.cache_size:
                    self.cache.popitem(last=False)
        return reply

    def map(self, payloads: list[dict]) -> list:
        """:meth:`post` for each payload, at most ``max_concurrency`` at a time; each result is the
        reply or the :class:`RemoteRewardError` it raised."""
        def one(p):
            try:
                return self.post(p)
            except RemoteRewardError as e:
                return e
        return list(self.pool.map(one, payloads))

    def _send(self, body: str):
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(0.5 * 2 ** (attempt - 1))
            with self.lock:
                self.requests += 1
            try:
                r = self.client.post(self.url, content=body, headers={"content-type": "application/json"})
            except self.httpx.TimeoutException:
                last = f"no reply within timeout = {self.timeout} s"
                continue
            except self.httpx.HTTPError as e:
                last = f"cannot connect: {type(e).__name__}: {e}"
                continue
            if r.status_code >= 500 or r.status_code == 429:
                last = f"HTTP {r.status_code}: {r.text[:200]}"
                continue
            if r.status_code >= 400:
                raise RemoteRewardError(f"reward endpoint {self.url}", f"HTTP {r.status_code}: {r.text[:200]}",
                                        "check the URL and the request format the server expects")
            try:
                return r.json()
            except ValueError:
                raise RemoteRewardError(f"reward endpoint {self.url}", f"the reply is not JSON: {r.text[:200]!r}",
                                        "point the component at a server that answers JSON") from None
        raise RemoteRewardError(f"reward endpoint {self.url}", f"{last} ({self.retries + 1} attempts)",
                                "start the server / check the URL, or raise timeout or retries; "
                                "on_failure: nan scores such rows as unscorable instead")


def fallback(values: list, failures: list, on_failure: str, where: str) -> torch.Tensor:
    """``values`` (NaN where a row failed) as ``[B]`` float32, or the first failure raised (``error``;
    a failure is a message or the :class:`RemoteRewardError` of a request)."""
    if failures and on_failure == "error":
        if isinstance(failures[0], RemoteRewardError):
            raise failures[0]
        raise RemoteRewardError(where, failures[0], "fix the server or its reply; on_failure: nan scores such rows "
                                "as unscorable instead")
    if failures:
        unscorable = sum(v is None for v in values)
        first = failures[0].why if isinstance(failures[0], RemoteRewardError) else failures[0]
        warnings.warn(f"{where}: {unscorable} rows unscorable (NaN) this call; first: {first}", stacklevel=2)
    return torch.tensor([math.nan if v is None else float(v) for v in values], dtype=torch.float32)


class RemoteParams(Reward.Params):
    timeout: float = Field(30.0, gt=0, description="seconds one request may take")
    retries: int = Field(2, ge=0, description="more attempts after a connection error, timeout, 5xx or 429")
    max_concurrency: int = Field(8, ge=1, description="requests in flight at once")
    cache_size: int = Field(10000, ge=0, description="replies kept by request body (0: no cache)")
    on_failure: str = Field("error", pattern="^(error|nan)$", description="a request that fails or a reply that "
                            "cannot be read: error (the run stops) or nan (its rows are unscorable, a warning)")


class RemoteReward(Reward):
    """A reward server (a served reward model or verifier), called over HTTP; ``[B]`` float32.

    Request: ``POST url`` with JSON ``{"prompts": [...], "completions": [...], "answers": [...]}``
    for ``batch_size`` rows at a time (prompts as the data set's prompt -- chat messages or text --
    completions as text, answers the rows' ``answer``, None when missing). Reply: JSON
    ``{"rewards": [float, ...]}``, one per row (None: unscorable), like OpenRLHF's
    ``--remote_rm_url`` servers (which answer ``{"rewards": ...}``). Requests run concurrently
    (``max_concurrency``) and the component runs concurrently with the step's other I/O-bound
    rewards. Errors and the per-row fallback: module docstring (:class:`RemoteRewardError`; a reply
    with the wrong number of rewards or a non-number is unreadable).
    Source: OpenRLHF remote reward model (``--remote_rm_url``); verl's reward loop."""

    name = "remote_reward"
    concurrent = True

    class Params(RemoteParams):
        url: str = Field(..., pattern=r"^https?://", description="the scoring endpoint, e.g. http://127.0.0.1:8000/score")
        batch_size: int = Field(32, ge=1, description="rows per request")

    def __init__(self, **params):
        super().__init__(**params)
        p = self.params
        self.endpoint = Endpoint(p.url, p.timeout, p.retries, p.max_concurrency, p.cache_size)

    @hookimpl
    def reward(self, rollout):
        b, p = len(rollout), self.params
        rows = rollout.rows if len(rollout.rows) == b else [{} for _ in range(b)]
        prompts = [r.get("prompt", t) for r, t in zip(rows, rollout.prompts or [""] * b)]
        spans = [(i, min(i + p.batch_size, b)) for i in range(0, b, p.batch_size)]
        replies = self.endpoint.map([{"prompts": prompts[i:j], "completions": list(rollout.completions[i:j]),
                                      "answers": [r.get("answer") for r in rows[i:j]]} for i, j in spans])
        values, failures = [None] * b, []
        for (i, j), reply in zip(spans, replies):
            got = reply.get("rewards") if isinstance(reply, dict) else None
            ok = isinstance(got, list) and len(got) == j - i and all(
                v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in got)
            if ok:
                values[i:j] = got
            else:
                failures.append(reply if isinstance(reply, RemoteRewardError) else
                                f"rows {i}..{j - 1}: expected {{'rewards': [{j - i} numbers]}}, got {str(reply)[:200]}")
        return fallback(values, failures, p.on_failure, f"reward: remote_reward ({p.url})")
