"""Token ids of an episode's prompt and of the environment's turns between model turns (the chat template
over untrusted text: :mod:`policyzoo.contract.untrusted`); the episode loop is :mod:`policyzoo.step.episodes`."""

from __future__ import annotations

from policyzoo.contract.untrusted import encode_chat, encode_marked, encode_text, render_chat
from policyzoo.errors import ComponentError, ConfigError, DataError, UserError

_SENTINEL = "\u2063policyzoo-turn\u2063"


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
