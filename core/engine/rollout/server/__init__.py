"""``engine.rollout: server``: sampling through rollout servers (``policyzoo serve``: vLLM's own
OpenAI-compatible server with policyzoo's worker extension) instead of vLLM in this process.

* **Connect** (:func:`connect`, in the pre-load checks, before any weights load, also for
  ``--dry-run``): each server of ``engine.servers`` must answer, run the same policyzoo and vLLM
  versions, serve a model with this model's config (``protocol.MODEL_KEYS``), dtype and
  tokenizer (a probe text tokenised by the server equals this tokenizer's ids), at least the run's
  context, with processed log-probs and a weight-transfer backend. Anything else is refused with a
  :class:`~policyzoo.engine.rollout.server.protocol.ServerError` naming the server and what differs.
* **Sampling** (:class:`ServerRollout`, the interface of ``VLLMRollout``): one ``/v1/completions``
  request per prompt with its ``n`` samples and seed (``protocol``), sent concurrently; the
  prompts of a call are split into contiguous runs of whole groups, one run per server. Each data-
  parallel rank sends its own share.
* **Weights** (:meth:`ServerRollout.load_weights`): rank 0 pushes to every server over a process group
  with the server's workers (``weight_push``), then resets each server's prefix cache; other ranks only
  take part in the trainer's gather (ZeRO-3) and wait at a barrier. The sync check
  (``policyzoo.engine.sync.WeightSync.check_now``) then scores through the server as through the
  colocated engine.
* **The secret** (``auth``): with ``POLICYZOO_SERVER_TOKEN`` or ``engine.server_token_file``
  set, every request (sampling, weight routes, sync check) carries ``Authorization: Bearer <secret>``;
  a server answering 401/403 is refused with a :class:`ServerError` saying which token to set.
* **Failures**: a server that stops answering raises :class:`ServerError` ("restart it, then
  ``--resume``"): the step fails, no checkpoint is written for it, the last one stays intact.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import torch

from policyzoo.contract.policy_protocol import Generated
from policyzoo.engine import dist

from ..engine_base import NEXT_TOP_K, EngineBase, build_rollout, request_seed
from ..finish import finish
from . import protocol as wire
from .auth import auth_headers, refused, resolve_token
from .protocol import ServerError
from .weight_push import ServerGroup, push

#: a text whose ids the server's tokenizer must reproduce (words, digits, punctuation, non-ASCII)
PROBE = "Question: what is 12 + 7? Answer: 19. Ünïcödé — 東京, tabs\tand\nnewlines."
#: seconds a connect check waits for a server
CONNECT_TIMEOUT_S = 10.0


@dataclass
class Server:
    """A checked server: its base URL, served model name, worker count, weight backend and the
    shared secret sent to it (None: none; never shown in the repr)."""

    url: str
    model: str
    workers: int
    backend: str
    token: str | None = field(default=None, repr=False)


def _fail(url: str, what: str, e: Exception) -> ServerError:
    return ServerError(f"rollout server {url}", f"{what} failed: {type(e).__name__}: {e}",
                       "start it with `policyzoo serve --model MODEL --host HOST --port PORT` (and wait until it "
                       "answers /health), or fix engine.servers; a run stopped by this continues with "
                       "--resume RUN_DIR once the server is back (the last checkpoint is intact)")


def _call(client: httpx.Client, url: str, method: str, path: str, body=None, what: str = ""):
    try:
        r = client.request(method, url + path, json=body)
    except httpx.HTTPError as e:
        raise _fail(url, what or f"{method} {path}", e) from e
    if r.status_code in (401, 403):
        sent = "authorization" in client.headers
        raise refused(url, sent, ServerError)
    if r.status_code >= 400:
        raise ServerError(f"rollout server {url}", f"{what or path} answered HTTP {r.status_code}: {r.text[:300]}",
                          "start the server with `policyzoo serve` (it turns on the routes and the worker "
                          "extension the trainer needs)")
    return r.json() if r.content else None


def connect(addresses: list[str], model_info, dtype: str, max_model_len: int,
            token_file: str | None = None) -> list[Server]:
    """Check every server (see the module docstring); returns them in ``engine.servers`` order, each
    with the secret of ``token_file`` (``engine.server_token_file``) or ``POLICYZOO_SERVER_TOKEN``."""
    if not addresses:
        raise ServerError("engine.servers", "engine.rollout is server but no server is listed",
                          "set engine.servers=[HOST:PORT, ...] (servers started with `policyzoo serve`)")
    config = json.loads((model_info.path / "config.json").read_text())
    mine = {"versions": wire.installed_versions(), "model": wire.model_identity(config)}
    want = model_info.tokenizer(PROBE, add_special_tokens=False)["input_ids"]
    token = resolve_token(token_file, where="engine.server_token_file" if token_file else "the rollout server's token")
    out = []
    with httpx.Client(timeout=CONNECT_TIMEOUT_S, headers=auth_headers(token)) as client:
        for address in addresses:
            url = wire.parse_address(address)
            models = _call(client, url, "GET", "/v1/models", what="listing the served models")
            name = models["data"][0]["id"]
            rpc = _call(client, url, "POST", "/collective_rpc", {"method": "policyzoo_identity"},
                        what="reading the server's identity (policyzoo's worker extension)")
            ident = rpc["results"][0]
            problems = wire.identity_problems(mine, ident, dtype=dtype, max_model_len=max_model_len)
            got = _call(client, url, "POST", "/tokenize", {"model": name, "prompt": PROBE, "add_special_tokens": False},
                        what="tokenising a probe text")["tokens"]
            if got != want:
                problems.append(f"the server's tokenizer gives other ids for a probe text ({got[:8]}... vs "
                                f"{want[:8]}...)")
            if problems:
                raise ServerError(f"rollout server {url} (model {name})", "it cannot serve this run: "
                                  + "; ".join(problems), "start the server with the trainer's model folder, "
                                  f"--dtype {dtype} and the same policyzoo and vLLM versions (`policyzoo serve "
                                  f"--model {model_info.path}`)")
            out.append(Server(url, name, int(ident["world_size"]), ident["weight_transfer"], token))
    return out


class ServerRollout(EngineBase):
    """Sampling through rollout servers (see the module docstring). ``timeout_s``: seconds one
    HTTP request may take (``engine.server_timeout_s``); ``push_timeout_s``: the weight group's."""

    def __init__(self, model_info, servers: list[Server], timeout_s: float, push_timeout_s: float):
        super().__init__(model_info)
        self.servers = servers
        self.client = httpx.Client(timeout=timeout_s, limits=httpx.Limits(max_connections=256),
                                   headers=auth_headers(servers[0].token if servers else None))
        self.pool = ThreadPoolExecutor(64, thread_name_prefix="policyzoo-server")
        self.groups = []
        if dist.rank() == 0:
            for s in servers:
                g = ServerGroup(s.url, self._poster(s.url), s.backend, s.workers, push_timeout_s)
                g.open()
                self.groups.append(g)

    def _poster(self, url: str):
        return lambda path, body: _call(self.client, url, "POST", path, body)

    def _map(self, bodies: list[dict]) -> list[dict]:
        """POST each body to ``/v1/completions``, whole runs per server (:func:`split_groups`)."""
        jobs = []
        for s, (a, b) in zip(self.servers, wire.split_groups(len(bodies), len(self.servers))):
            for body in bodies[a:b]:
                jobs.append(self.pool.submit(_call, self.client, s.url, "POST", "/v1/completions",
                                             {**body, "model": s.model}, "sampling"))
        return [j.result() for j in jobs]

    def _sample(self, prompt_ids, n, max_tokens, temperature, seeds, **options):
        """Per prompt, its ``n`` choices as ``(ids, log-probs, truncated, text)``, each cut by
        :func:`~.finish.finish` like the colocated engine's (the text is the decoding of the trained ids)."""
        eos = list(self.info.eos_token_ids)
        allowed = len(self.tokenizer) if getattr(self.info, "undecodable_ids", None) else None
        bodies = [wire.completion_request("", p, n=n, max_tokens=m, temperature=temperature, seed=s, eos_ids=eos,
                                          allowed_ids=allowed, **options)
                  for p, m, s in zip(prompt_ids, max_tokens, seeds)]
        try:
            replies = [wire.parse_completion(r, n, temperature > 0) for r in self._map(bodies)]
        except ValueError as e:
            raise ServerError("rollout server", f"a reply could not be read: {e}",
                              "start the servers with `policyzoo serve` of this policyzoo version") from e
        stop = list(options.get("stop") or ())
        out = []
        for choices, m in zip(replies, max_tokens):
            group = []
            for ids, lps, trunc, _ in choices:
                toks, text, done, cut = finish(self.tokenizer, ids, eos, stop, m)
                group.append((toks, lps[:len(toks)], not done and (cut or trunc), text))
            out.append(group)
        return out

    def generate(self, rows: list[dict], n: int, max_tokens: int, temperature: float, seed: int,
                 top_p: float = 1.0, first_index: int = 0, top_k: int = 0, min_p: float = 0.0,
                 repetition_penalty: float = 1.0, stop: list[str] = ()):
        prompt_ids, texts = self.encode(rows)
        seeds = [request_seed(seed, first_index + i, n) for i in range(len(rows))]
        outs = self._sample(prompt_ids, n, [max_tokens] * len(rows), temperature, seeds, top_p=top_p, top_k=top_k,
                            min_p=min_p, repetition_penalty=repetition_penalty, stop=stop)
        flat = [c for group in outs for c in group]
        return build_rollout(prompt_ids, [c[0] for c in flat], [c[1] for c in flat], [c[2] for c in flat], rows,
                             texts, [c[3] for c in flat], n, self.info.pad_token_id, temperature, max_tokens,
                             first_index)

    def generate_tokens(self, contexts, max_tokens, temperature, seeds, top_p=1.0, top_k=0, min_p=0.0,
                        repetition_penalty=1.0, stop=()):
        """One continuation per token-id context (multi-turn episodes), as ``VLLMRollout``'s."""
        outs = self._sample(contexts, 1, list(max_tokens), temperature, list(seeds), top_p=top_p, top_k=top_k,
                            min_p=min_p, repetition_penalty=repetition_penalty, stop=stop)
        return [Generated(ids, lps, text, not trunc) for [(ids, lps, trunc, text)] in outs]

    def greedy(self, rows: list[dict], max_tokens: int):
        """One greedy response per prompt (held-out evaluation)."""
        prompt_ids, texts = self.encode(rows)
        outs = [g[0] for g in self._sample(prompt_ids, 1, [max_tokens] * len(rows), 0.0, [None] * len(rows))]
        return build_rollout(prompt_ids, [c[0] for c in outs], [[] for _ in outs], [c[2] for c in outs], rows, texts,
                             [c[3] for c in outs], 1, self.info.pad_token_id, 1.0, max_tokens)

    def load_weights(self, named_tensors) -> None:
        """Rank 0 sends the weights to every server and resets their prefix caches; every rank
        consumes ``named_tensors`` (a ZeRO-3 gather is collective) and then waits for rank 0."""
        if self.groups:
            push(self.groups, named_tensors)
            for s in self.servers:
                if not (_call(self.client, s.url, "POST", "/reset_prefix_cache", None) or {}).get("success", True):
                    raise ServerError(f"rollout server {s.url}", "its prefix cache could not be reset after the "
                                      "weight push (requests still running)", "run one trainer per server")
        else:
            for _ in named_tensors:
                pass
        dist.barrier()

    def replicas(self) -> list["ServerScorer"]:
        """One scorer per server: the sync check checks each (``policyzoo.engine.sync.check_weights``)."""
        return [ServerScorer(self.client, s) for s in self.servers]

    def score(self, ids: list[int]) -> torch.Tensor:
        return self.replicas()[0].score(ids)

    def score_next(self, ids: list[int], k: int = NEXT_TOP_K) -> dict[int, float]:
        return self.replicas()[0].score_next(ids, k)


@dataclass
class ServerScorer:
    """The sync check's two scorings through one server (as ``VLLMRollout.score`` / ``score_next``)."""

    client: httpx.Client
    server: Server

    def score(self, ids: list[int]) -> torch.Tensor:
        """Log-probs ``[len(ids) - 1]`` of tokens 1.. of ``ids`` at temperature 1 (prompt log-probs)."""
        s = self.server
        reply = _call(self.client, s.url, "POST", "/v1/completions", wire.score_request(s.model, ids), "the sync check")
        return torch.tensor(wire.parse_prompt_logprobs(reply, ids))

    def score_next(self, ids: list[int], k: int = NEXT_TOP_K) -> dict[int, float]:
        """The top ``k`` next-token log-probs after ``ids`` through the generation path (prefix cache read)."""
        s = self.server
        reply = _call(self.client, s.url, "POST", "/v1/completions", wire.next_request(s.model, ids, k),
                      "the sync check")
        return wire.parse_top_logprobs(reply)
