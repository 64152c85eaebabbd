"""Untrusted text: data and environment text is tokenised so that special-token strings in it stay text.

The rule: only the chat template's own structure yields control tokens. Text from a data set (the
contents of a prompt's chat messages, a plain-text prompt, an answer), from an environment (the
contents of ``Observation.messages``) or from a completion scored by a reward model is tokenised
with the tokenizer's special-token matching off (``split_special_tokens=True``): a tool result
that holds ``<|im_end|>\\n<|im_start|>assistant\\n...`` stays those characters, as ordinary text
tokens, and cannot close its own turn or write a fake assistant turn into the training sequence.
Model-generated ids are never re-tokenised (:mod:`policyzoo.step.episodes`).

How (:func:`render_chat`, :func:`encode_marked`). Every special string in a message's ``content``
is replaced by a *marker* (private-use characters around the special's index, chosen absent from
the conversation), and the conversation is rendered twice: ``raw``, the contents as they are
(markers aside), and ``bound``, each content text between two *boundary* characters. In ``bound``
no special string can span a content's edge, so the special strings found there are the
template's own (its structure). Then:

* no special string in any content: ``raw`` is tokenised in one call, exactly as
  ``apply_chat_template(..., tokenize=True)`` does -- benign text keeps its ids -- and the call's
  control tokens are checked to be the structure's, in order;
* otherwise, or when that check fails (text that forms a special string only together with other
  text, e.g. two content parts ``"<|im_"`` and ``"end|>"`` that the template joins, or one the
  tokenizer matches only after normalising): ``bound`` is cut at the structure's special strings,
  each becomes its id, and each piece between them (boundaries removed, markers turned back into
  the special strings) is tokenised with special-token matching off -- what the tokenizer does
  with the text between special tokens, except that the contents' special strings stay text.

Which strings are special, the fields that are structure, and the limits of the second way:
docs/security.md ("Untrusted text: which strings are special, and the limits").
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass
from typing import Any, Mapping

from policyzoo.errors import DataError, UserError

#: where the marker and boundary characters are taken from (Unicode private use area)
_FREE_FIRST, _FREE_LAST = 0xE000, 0xF8FF


def special_strings(tokenizer) -> tuple[str, ...]:
    """Every special-token string of ``tokenizer``, longest first (as the tokenizer matches them:
    leftmost, then longest)."""
    return _info(tokenizer).specials


@dataclass(frozen=True)
class _Info:
    """What one tokenizer's special tokens are: their strings (longest first), a pattern matching
    them, each one's index and id, the ids that text must not produce (all but an unknown token
    the model gives for unknown text, see :func:`_unk`), and the added tokens by string."""

    specials: tuple[str, ...]
    pattern: re.Pattern | None
    index: dict[str, int]
    ids: dict[str, int]
    control: dict[str, int]
    control_ids: frozenset[int]
    added: dict[str, Any]


_INFO: "weakref.WeakKeyDictionary[Any, tuple[tuple, _Info]]" = weakref.WeakKeyDictionary()


def _info(tokenizer) -> _Info:
    """The :class:`_Info` of ``tokenizer``, kept per tokenizer object until its vocabulary size or
    named special tokens change (adding a token changes the size)."""
    key = (len(tokenizer), tuple(getattr(tokenizer, "all_special_tokens", None) or ()))
    try:
        cached = _INFO.get(tokenizer)
    except TypeError:  # not weak-referenceable: computed every time
        cached = None
    if cached is not None and cached[0] == key:
        return cached[1]
    added = {str(t): t for t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values()}
    found = {str(s) for s in key[1] if s} | {s for s, t in added.items() if getattr(t, "special", False) and s}
    specials = tuple(sorted(found, key=lambda s: (-len(s), s)))
    ids = {s: tokenizer.convert_tokens_to_ids(s) for s in specials}
    ids = {s: int(i) for s, i in ids.items() if isinstance(i, int)}
    control = {s: i for s, i in ids.items() if s != _unk(tokenizer)}
    info = _Info(specials, re.compile("|".join(map(re.escape, specials))) if specials else None,
                 {s: k for k, s in enumerate(specials)}, ids, control, frozenset(control.values()), added)
    try:
        _INFO[tokenizer] = (key, info)
    except TypeError:
        pass
    return info


def rules_key(tokenizer) -> str:
    """A canonical text of the special-token rules the encoders here apply to ``tokenizer``: its
    special strings with their ids, and every added token's attributes (content,
    special, lstrip, rstrip, normalized, single word). Two tokenizers with the same key (and the same
    vocabulary and template) encode every prompt alike; caches of counts key on it."""
    info = _info(tokenizer)
    added = sorted((s, bool(getattr(t, "special", False)), bool(getattr(t, "lstrip", False)),
                    bool(getattr(t, "rstrip", False)), bool(getattr(t, "normalized", False)),
                    bool(getattr(t, "single_word", False))) for s, t in info.added.items())
    return repr((info.specials, sorted(info.ids.items()), added))  # the control ids follow from these and unk


@dataclass(frozen=True)
class Marked:
    """A rendered text in two forms (see the module docstring): ``raw`` and ``bound`` (content
    texts between ``edge`` characters); in both, a content's special strings are markers ``open``
    + index in ``specials`` + ``close``."""

    raw: str
    bound: str
    specials: tuple[str, ...]
    open: str
    close: str
    edge: str

    def after(self, text: str) -> "Marked":
        """Both forms cut after the first occurrence of ``text`` (trusted text, e.g. a sentinel);
        unchanged where it does not occur."""
        cut = [s[s.find(text) + len(text):] if text in s else s for s in (self.raw, self.bound)]
        return Marked(cut[0], cut[1], self.specials, self.open, self.close, self.edge)

    def drop_prefix(self, prefix: str) -> "Marked":
        """Both forms without a leading ``prefix`` (where they start with it)."""
        cut = [s[len(prefix):] if prefix and s.startswith(prefix) else s for s in (self.raw, self.bound)]
        return Marked(cut[0], cut[1], self.specials, self.open, self.close, self.edge)

    def text(self, piece: str) -> str:
        """A piece of ``bound`` as text: boundaries removed, markers back to the special strings."""
        piece = piece.replace(self.edge, "")
        if self.open not in piece:
            return piece
        return re.sub(re.escape(self.open) + r"(\d+)" + re.escape(self.close),
                      lambda m: self.specials[int(m.group(1))], piece)


def _strings(value: Any):
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


class _Escaper:
    """Markers and boundaries for one conversation: characters absent from all of ``texts``."""

    def __init__(self, tokenizer, texts: list[str]):
        info = _info(tokenizer)
        self.specials, self.pattern, self.index = info.specials, info.pattern, info.index
        joined = "".join(texts)
        free = (chr(c) for c in range(_FREE_FIRST, _FREE_LAST + 1) if chr(c) not in joined)
        self.open, self.close, self.edge = next(free), next(free), next(free)

    def escape(self, value: Any, edge: bool) -> Any:
        """``value`` (a content: a string, or parts) with its special strings as markers; with
        ``edge``, every non-empty text (the string, a part's ``text``) between boundaries."""
        if isinstance(value, str):
            if self.pattern is not None:
                value = self.pattern.sub(lambda m: f"{self.open}{self.index[m.group(0)]}{self.close}", value)
            return f"{self.edge}{value}{self.edge}" if edge and value else value
        if isinstance(value, Mapping):
            return {k: self.escape(v, edge and k == "text") for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.escape(v, edge) for v in value]
        return value

    def marked(self, raw: str, bound: str) -> Marked:
        return Marked(raw, bound, self.specials, self.open, self.close, self.edge)


def render_chat(tokenizer, messages: list, where: str, error: type[UserError] = DataError, trusted: int = 0,
                **template_kwargs) -> Marked:
    """The conversation rendered with the tokenizer's chat template (``template_kwargs``, e.g.
    ``add_generation_prompt=True``, go to ``apply_chat_template``), every message's ``content``
    untrusted but the first ``trusted`` messages' (the caller's own). Raises ``error(where, ...)``
    when a message is not a dict or a field other than ``content`` holds a special string."""
    esc = _Escaper(tokenizer, [s for m in messages for s in _strings(m)])
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise error(where, f"message {i} is a {type(m).__name__}, not a chat message",
                        "give each message as a dict {'role': ..., 'content': ...}")
        for key, value in m.items():
            for s in (_strings(value) if key != "content" and esc.pattern is not None else ()):
                if (hit := esc.pattern.search(s)) is not None:
                    raise error(where, f"message {i}'s {key!r} holds the special-token string {hit.group(0)!r}; "
                                "only a message's content may hold untrusted text (where it stays text), every "
                                "other field is the chat template's structure",
                                f"remove {hit.group(0)!r} from the {key!r} field (put such text in the content)")

    def render(edge: bool) -> str:
        out = [dict(m) if i < trusted or "content" not in m else {**m, "content": esc.escape(m["content"], edge)}
               for i, m in enumerate(messages)]
        return str(tokenizer.apply_chat_template(out, tokenize=False, **template_kwargs))

    return esc.marked(render(False), render(True))


def mark_text(tokenizer, trusted: str, untrusted: str) -> Marked:
    """``trusted + untrusted`` as :class:`Marked`: the special strings of ``trusted`` are
    structure, ``untrusted`` is text."""
    esc = _Escaper(tokenizer, [trusted, untrusted])
    return esc.marked(trusted + esc.escape(untrusted, False), trusted + esc.escape(untrusted, True))


def affixes(tokenizer) -> tuple[list[int], list[int]]:
    """The ids ``add_special_tokens=True`` puts before and after a text (e.g. ``[bos]``, ``[]``)."""
    full = list(tokenizer("a").input_ids)
    core = list(tokenizer("a", add_special_tokens=False).input_ids)
    for i in range(len(full) - len(core) + 1):
        if full[i:i + len(core)] == core:
            return full[:i], full[i + len(core):]
    return [], []


def _unk(tokenizer) -> str | None:
    """The unknown token when the tokenizer's model gives it for text it has no piece for
    (WordLevel, WordPiece, Unigram; not a byte-level BPE without ``unk_token``), else None."""
    model = getattr(getattr(tokenizer, "backend_tokenizer", None), "model", None)
    return None if getattr(model, "unk_token", "") is None else getattr(tokenizer, "unk_token", None)


def encode_marked(tokenizer, marked: Marked, add_special_tokens: bool = False, where: str = "data",
                  error: type[UserError] = DataError) -> list[int]:
    """Token ids of ``marked`` (see the module docstring): its structural special strings as their
    ids, everything else as text; with ``add_special_tokens`` the tokenizer's own affixes (a BOS)
    around. Raises ``error(where, ...)`` when the tokenizer forms a control token from text even
    with special-token matching off."""
    info = _info(tokenizer)
    structure = list(info.pattern.finditer(marked.bound)) if info.pattern is not None else []
    control, control_ids = info.control, info.control_ids
    if marked.open not in marked.raw:  # no special string in the contents: one call, the ids as before
        ids = list(tokenizer(marked.raw, add_special_tokens=add_special_tokens).input_ids)
        pre, post = affixes(tokenizer) if add_special_tokens else ([], [])
        want = [i for i in pre if i in control_ids] + [control[m.group(0)] for m in structure
                                                       if m.group(0) in control] + [i for i in post if i in control_ids]
        if [i for i in ids if i in control_ids] == want:
            return ids
    out: list[int] = []
    pos, strip_left = 0, False
    for m in structure:
        attrs, piece = info.added.get(m.group(0)), marked.text(marked.bound[pos:m.start()])
        piece = piece.lstrip() if strip_left else piece
        out += _text_ids(tokenizer, piece.rstrip() if getattr(attrs, "lstrip", False) else piece, control_ids,
                         where, error)
        out.append(info.ids[m.group(0)])
        pos, strip_left = m.end(), bool(getattr(attrs, "rstrip", False))
    tail = marked.text(marked.bound[pos:])
    out += _text_ids(tokenizer, tail.lstrip() if strip_left else tail, control_ids, where, error)
    pre, post = affixes(tokenizer) if add_special_tokens else ([], [])
    return pre + out + post


def _text_ids(tokenizer, text: str, control: set[int], where: str, error: type[UserError]) -> list[int]:
    if not text:
        return []
    ids = list(tokenizer(text, add_special_tokens=False, split_special_tokens=True).input_ids)
    if any(i in control for i in ids):
        raise _forms_control(tokenizer, ids, control, where, error)
    return ids


def _forms_control(tokenizer, ids: list[int], control: set[int], where: str, error: type[UserError]) -> UserError:
    bad = tokenizer.convert_ids_to_tokens(next(i for i in ids if i in control))
    return error(where, f"the tokenizer forms the control token {bad!r} from text even with special-token matching "
                 "off, so untrusted text could end its turn", "use a tokenizer whose special tokens are added "
                 "tokens (tokenizer.add_special_tokens), not pieces that ordinary text merges into")


def encode_chat(tokenizer, messages: list, where: str, error: type[UserError] = DataError,
                add_generation_prompt: bool = True) -> list[int]:
    """Ids of a conversation through the chat template (with the generation prompt): those of
    ``apply_chat_template(messages, add_generation_prompt=True, tokenize=True)`` when no content
    holds a special string, else the same with those strings as text. Errors: as :func:`render_chat`."""
    marked = render_chat(tokenizer, messages, where, error, add_generation_prompt=add_generation_prompt)
    return encode_marked(tokenizer, marked, False, where, error)


def encode_text(tokenizer, text: str, add_special_tokens: bool = True, where: str = "data",
                error: type[UserError] = DataError) -> list[int]:
    """Ids of untrusted plain text: ``tokenizer(text, split_special_tokens=True)`` (the tokenizer's
    affixes, e.g. a BOS, still added with ``add_special_tokens``); special strings stay text.
    Raises ``error(where, ...)`` as :func:`encode_marked`."""
    ids = list(tokenizer(text, add_special_tokens=add_special_tokens, split_special_tokens=True).input_ids)
    control = _info(tokenizer).control_ids
    if any(i in control for i in ids):  # only the affixes (a BOS) may be control tokens
        pre, post = affixes(tokenizer) if add_special_tokens else ([], [])
        inner = ids[len(pre):len(ids) - len(post)]
        if pre + inner + post != ids or any(i in control for i in inner):
            raise _forms_control(tokenizer, ids, control, where, error)
    return ids
