"""Every prompt's token count, remembered between runs.

Before any weights load, a run counts the tokens of every prompt of its data (the chat template,
the generation prompt, the untrusted-text rules of :mod:`policyzoo.contract.untrusted`) to check it
against the context and to size vLLM's ``max_model_len``. For GSM8K's 5,100 prompts and the default
model that is 3-4 s of each start on a 2-core machine, the same every time. :class:`LengthCache`
keeps the counts in ``CACHE/prompt-lengths/<fingerprint>.json`` (the cache of
:func:`policyzoo.engine.models.cache_dir`), one entry per prompt's content, so a later run counts
only the prompts it has not seen.

The fingerprint covers everything a count depends on: the tokenizer's whole serialization (vocabulary,
merges, added tokens, normalizer), its chat template, the special strings the untrusted-text rules
treat as structure (:func:`~policyzoo.contract.untrusted.rules_key`: named, extra and added special
tokens with their ids and attributes), the versions of
transformers, tokenizers and jinja2, and the source of the modules that encode a prompt. Any change
gives another file, so a count is never reused under other rules. Only counts are kept: a prompt
that fails to encode raises each time, as before. A file that cannot be read or written is
ignored (the counts are computed as without a cache); files are replaced whole (``os.replace``),
merged with what another run wrote meanwhile.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Callable

from policyzoo.contract import untrusted
from policyzoo.step import episodes

MAX_ENTRIES = 500_000  # counts kept per fingerprint (~40 MB of JSON at most); the oldest go first


def _source(module) -> str:
    try:
        return inspect.getsource(module)
    except (OSError, TypeError):
        return repr(module)


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "-"


def fingerprint(tokenizer) -> str | None:
    """A hex digest of what a prompt's count depends on, or None for a tokenizer without a
    serializable fast backend (no cache then)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str"):
        return None
    try:
        serialized = backend.to_str()
    except Exception:  # noqa: BLE001 - a backend that cannot serialize itself: no cache
        return None
    h = hashlib.sha256()
    for part in (serialized, json.dumps(getattr(tokenizer, "chat_template", None), sort_keys=True, default=repr),
                 untrusted.rules_key(tokenizer),  # every special string the rules treat as structure
                 json.dumps(getattr(tokenizer, "special_tokens_map", {}), sort_keys=True, default=repr),  # bos_token...
                 type(tokenizer).__name__, *(_version(d) for d in ("transformers", "tokenizers", "jinja2")),
                 _source(untrusted), _source(episodes), _source(inspect.getmodule(fingerprint))):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()


def prompt_key(prompt) -> str:
    """A digest of one prompt's content (a string, or chat messages)."""
    text = json.dumps(prompt, sort_keys=True, ensure_ascii=False, default=repr)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


class LengthCache:
    """The remembered counts of one tokenizer (see the module docstring). :meth:`wrap` gives a
    counting function that looks up before it counts; :meth:`save` writes the new counts."""

    def __init__(self, tokenizer, root: Path):
        digest = fingerprint(tokenizer)
        self.path = None if digest is None else Path(root) / "prompt-lengths" / f"{digest[:40]}.json"
        self.counts: dict[str, int] = {}
        self.new = 0  # counted since the last save
        self.remembered = 0  # prompts not counted: found in the file (or seen before in this run)
        if self.path is not None:
            self.counts = self._read(self.path)

    @staticmethod
    def _read(path: Path) -> dict[str, int]:
        """The file's counts; ``{}`` for a missing or unreadable file, entries that are no count left out."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {k: v for k, v in data.items() if type(v) is int and v >= 0}  # not bools, not negatives

    def wrap(self, count: Callable[[object], int]) -> Callable[[object], int]:
        """``count`` with the cache in front: a prompt seen before (same content) is not counted again."""
        if self.path is None:
            return count

        def cached(prompt) -> int:
            key = prompt_key(prompt)
            n = self.counts.get(key)
            if n is None:
                n = self.counts[key] = int(count(prompt))
                self.new += 1
            else:
                self.remembered += 1
            return n

        return cached

    def save(self) -> None:
        """Write the counts when new ones were made (best effort: an unwritable cache is skipped)."""
        if self.path is None or not self.new:
            return
        merged = {**LengthCache._read(self.path), **self.counts}  # what a concurrent run wrote meanwhile stays
        items = list(merged.items())[-MAX_ENTRIES:]  # insertion order: the oldest file entries first
        tmp = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".lengths-", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(dict(items), f, separators=(",", ":"))
            os.chmod(tmp, 0o644)  # readable by others sharing the cache, as the converted model is
            os.replace(tmp, self.path)
        except OSError:
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)
        self.new = 0
