"""How every rollout engine ends a response: one rule for ids and text, whatever the engine did.

The invariant (``tests/test_rollout_invariant.py``, on every engine and path: single-turn, multi-turn
``generate_tokens``, overlap; the rollout server's replies in ``tests/test_server_protocol.py``): the
completion a reward reads is exactly
``tokenizer.decode(ids, skip_special_tokens=True)`` of the ids that are trained, and no trained id was
not sampled. :func:`finish` applies it to the raw ids an engine returns:

* **End of sequence**: the response ends at the first id of ``eos_token_ids``, that id included
  (trained: the model learns to stop). Anything after it (transformers pads finished sequences of
  a batch with the pad id, which may equal an EOS id) is dropped.
* **Stop strings** (``algorithm.sample.stop``): the response ends at the *token that holds* the
  end of the first stop string, that token included; the text is the decoding of those ids, so it
  holds the stop string and may hold a few characters after it in the same token. Stop strings
  are matched in that decoding (special tokens skipped), as vLLM matches them in its output text;
  vLLM stops at that token (its text stops right after the string: we decode the ids instead);
  transformers runs :func:`text_stop` (its own ``stop_strings`` match inside the text of special
  tokens too: ``<|endoftext|>`` holds "e") and pads finished rows (dropped here). TRL's vLLM path and verl keep
  vLLM's text; the difference is the characters after the stop string inside its last token.
* **Undecodable ids** (a model whose ``vocab_size`` exceeds the tokenizer's length, e.g.
  Qwen-family checkpoints padding the embedding): never sampled; the engines mask them at the
  logits (vLLM ``allowed_token_ids``, transformers ``suppress_tokens``), see
  ``ModelInfo.undecodable_ids``.
"""

from __future__ import annotations


def _holds_stop(text: str, stop: list[str]) -> bool:
    return any(s and s in text for s in stop)


def stop_cut(tokenizer, ids: list[int], stop: list[str]) -> int | None:
    """The number of ids up to and including the token that completes the first stop string
    (None when the decoded ids hold none). Binary search over prefix decodes: a prefix that holds a
    stop string keeps holding it when extended."""
    if not stop or not _holds_stop(tokenizer.decode(ids, skip_special_tokens=True), stop):
        return None
    lo, hi = 1, len(ids)  # the smallest k whose prefix ids[:k] holds a stop string
    while lo < hi:
        mid = (lo + hi) // 2
        if _holds_stop(tokenizer.decode(ids[:mid], skip_special_tokens=True), stop):
            hi = mid
        else:
            lo = mid + 1
    return lo


def finish(tokenizer, ids: list[int], eos: set[int] | list[int], stop: list[str], max_tokens: int
           ) -> tuple[list[int], str, bool, bool]:
    """``(ids, text, finished, truncated)`` of one raw response: ids cut at the first EOS (kept) or
    at the token completing a stop string (kept), whichever comes first; ``text`` their decoding
    (special tokens skipped); ``finished`` when an EOS or a stop string ended it; ``truncated``
    when it ran to ``max_tokens`` without either."""
    eos = set(eos)
    end = next((k + 1 for k, t in enumerate(ids) if t in eos), None)
    cut = stop_cut(tokenizer, ids[:end] if end else ids, stop)
    if cut is not None:
        end = cut
    out = ids if end is None else ids[:end]
    finished = end is not None
    return out, tokenizer.decode(out, skip_special_tokens=True), finished, not finished and len(out) >= max_tokens


def text_stop(tokenizer, stop: list[str], start: int):
    """A transformers ``StoppingCriteriaList`` that ends each sequence once its generated ids (from
    position ``start`` of ``input_ids``) decode to a text holding a stop string (the rule of :func:`finish`)."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    class TextStop(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            done = [_holds_stop(tokenizer.decode(row[start:].tolist(), skip_special_tokens=True), stop)
                    for row in input_ids]
            return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([TextStop()])
