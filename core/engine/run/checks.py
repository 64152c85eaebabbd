"""The pre-run checks: the task against the rewards, the model's tokenizer and context, and the
sampling settings, made before any model loads (errors) or at start-up and during the run (warnings).

* :func:`check_answers`: prompt-only data with a reward that needs the reference answer.
* :func:`fit_prompts`: drop (or refuse) rows whose prompt does not fit the context.
* :func:`check_chat_template`: the task's prompts are chat messages, so the tokenizer must have a
  chat template; without one ``apply_chat_template`` fails in the first prompt's encoding.
* :func:`template_system_turn`: some templates (SmolLM2's, Qwen2.5's) insert their own default
  system message when a conversation has none, so ``data.system_prompt: ""`` does not remove
  it. Detected by rendering a one-message conversation and looking for a system turn before it.
* :func:`check_sampling_options`: a sampling option (top_p, top_k, min_p, repetition_penalty,
  stop) set on the ``sample`` component that the engine does not honour, on any path
  (single-turn, env episodes, overlap), refused before any model loads.
* :func:`sampling_warning`: a temperature near 0 with G > 1 samples G (nearly) identical
  responses: every group has reward std 0, every advantage is 0, nothing is learned.
* :class:`ZeroSignalWatch`: the same seen during the run (``zero_std_frac`` 1.0 for several
  steps in a row), whatever its cause.
* :func:`check_teacher`: ``model.teacher`` (on-policy distillation) is a model folder whose
  tokenizer has the student's vocabulary (the same token for every id: the teacher scores the
  student's token ids as they are), and the run has a component that reads it (a ``term`` with
  ``needs_ref``); such a term without a teacher is refused too.
* :func:`policyzoo.engine.run.preload.preload` calls every one of them, with the other checks a run
  makes before any weights load.
* :func:`filter_bias_warning`: a sampling filter (top_p, top_k, min_p, repetition_penalty) with a
  component that reads the sampler's log-probs: they are of the filtered, renormalised
  distribution, the trainer's of the full one, so every ratio between them is biased.
"""

from __future__ import annotations

from typing import Callable

from policyzoo import rules
from policyzoo.contract import SAMPLING_OPTIONS
from policyzoo.data import fit_prompt_lengths
from policyzoo.engine.models import ModelError, resolve_model
from policyzoo.errors import ConfigError, DataError

#: below this temperature, samples of one prompt are expected to coincide (warned with G > 1)
LOW_TEMPERATURE = 0.1
#: steps in a row with every group at reward std 0 before the run warns
ZERO_SIGNAL_STEPS = 3
_PROBE = "policyzoo-probe-7f3a"
#: dropped rows named in a warning (the rest counted)
MAX_NAMED = 10


def check_chat_template(tokenizer, rows: list[dict], where: str) -> None:
    """Raise :class:`ModelError` when a prompt is a list of chat messages and the tokenizer has
    no chat template."""
    if getattr(tokenizer, "chat_template", None):
        return
    if any(isinstance(r.get("prompt"), list) for r in rows):
        raise ModelError(where, "the tokenizer has no chat template, and the task's prompts are chat messages "
                         "(system, few-shot examples, the question) that only a template turns into tokens",
                         "set data.prompt_format: plain (the prompt as one text, for models without a "
                         "template), or add a chat template to the model folder (set tokenizer.chat_template "
                         "to a Jinja template and call tokenizer.save_pretrained(FOLDER))")


def template_system_turn(tokenizer) -> str | None:
    """The text the chat template puts before a lone user message when it holds a system turn
    (the template's own default system message), else None. Heuristic: the rendered text before
    the user's content mentions ``system``."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": _PROBE}], tokenize=False,
                                             add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - a template that cannot render this is checked elsewhere
        return None
    head = str(text).split(_PROBE)[0]
    return head.strip() if "system" in head.lower() else None


def system_turn_warning(tokenizer, rows: list[dict]) -> str | None:
    """A warning when the rows carry no system message but the template adds its own."""
    bare = [r for r in rows if isinstance(r.get("prompt"), list) and r["prompt"]
            and r["prompt"][0].get("role") != "system"]  # plain-text prompts use no template
    if not bare:
        return None
    added = template_system_turn(tokenizer)
    if added is None:
        return None
    excerpt = " ".join(added.split())[:160]
    return (f"the prompts have no system message, and the model's chat template adds its own: {excerpt!r}; "
            "it is used as is (an empty data.system_prompt would not remove it). To change it, set "
            "data.system_prompt to the text you want, or edit the template's default (tokenizer.chat_template) "
            "in a copy of the model folder")


def sampling_warning(temperature: float, n: int) -> str | None:
    if n > 1 and temperature < LOW_TEMPERATURE:
        return (f"sampling temperature {temperature:g} with {n} samples per prompt: the samples of a prompt will be "
                "(nearly) identical, every group's reward std 0 and every advantage 0, so nothing is learned; "
                f"use a temperature >= {LOW_TEMPERATURE:g} (e.g. algorithm.sample.temperature=1.0)")
    return None


#: sampling options that filter or reshape the sampled distribution (its log-probs are then of another one)
FILTERS = ("top_p", "top_k", "min_p", "repetition_penalty")


def filter_bias_warning(run, overlap: str = "none", max_staleness: int = 0) -> str | None:
    """A warning when the sample component filters the distribution and something reads the
    sampler's log-probs ``rollout_logprobs``: a ratio component whose hook method takes them (tis,
    mis, icepop, opsm, geo_tis ...) or ``engine.overlap: one_step`` / ``engine.max_staleness`` >= 1
    (off-policy rows take them as pi_old). vLLM reports log-probs of the distribution sampled from
    (``processed_logprobs``: renormalised over the kept tokens), the trainer scores the full one, so
    on every sampled token pi_trainer / pi_sampler = the kept mass (< 1): with p = [0.5, 0.3, 0.2] and top_p 0.8 the
    sampler's p(token 0) is 0.5 / 0.8 = 0.625 and the ratio 0.8. That is a bias the consumer would
    "correct", not an engine mismatch (TRL issue #6789; NeMo-RL applies the filter to the trainer's
    logits instead). None when no filter is set or nothing reads the sampler's log-probs."""
    p = run.sample.params
    on = [f"{k}={getattr(p, k)!r}" for k in FILTERS if getattr(p, k, SAMPLING_OPTIONS[k]) != SAMPLING_OPTIONS[k]]
    if not on:
        return None
    readers = []
    impls = run.pm.hook.ratio.get_hookimpls()
    if impls and "rollout_logprobs" in impls[0].argnames:
        readers.append(f"the ratio component {run.ratio.name!r}")
    if overlap != "none":
        readers.append(f"engine.overlap={overlap} (rows sampled by older weights use them as pi_old)")
    if max_staleness:
        readers.append(f"engine.max_staleness={max_staleness} (rows sampled by older weights use them as pi_old)")
    if not readers:
        return None
    return (f"sampling with {', '.join(on)} while {' and '.join(readers)} read(s) the sampler's log-probs: they are "
            "of the filtered, renormalised distribution and the trainer's of the full one, so pi_trainer / "
            "pi_sampler is the kept probability mass (< 1) on every sampled token -- a bias, not an engine "
            "mismatch. Sample without the filter (top_p 1, top_k 0, min_p 0, repetition_penalty 1) or use a "
            "ratio that does not read rollout_logprobs (e.g. algorithm.ratio.use=token)")


class ZeroSignalWatch:
    """Counts steps in a row whose ``zero_std_frac`` is 1.0 (every group's rewards equal);
    :meth:`update` returns a warning once, when the count reaches :data:`ZERO_SIGNAL_STEPS`."""

    def __init__(self, steps: int = ZERO_SIGNAL_STEPS):
        self.steps, self.run, self.warned = steps, 0, False

    def update(self, metrics: dict) -> str | None:
        frac = metrics.get("zero_std_frac")
        self.run = self.run + 1 if frac is not None and frac >= 1.0 else 0
        if self.run < self.steps or self.warned:
            return None
        self.warned = True
        return (f"zero_std_frac has been 1.0 for {self.run} steps in a row: in every group all samples got the "
                "same reward, so every advantage is 0 and the loss and gradient are 0. Raise "
                "algorithm.sample.temperature, check that the reward can tell responses apart, or use an "
                "easier task")


def check_answers(task, run) -> None:
    """Prompt-only data (``task.missing_answer`` set) with a reward that compares completions with
    the reference answer (``needs_answer``: ``answer_match``, ``math_verify``) raises
    :class:`DataError`; rewards that need none (``reward_model``, ``function``) go on."""
    needing = [c.name for c in run.reward if getattr(c, "needs_answer", False)]
    if task.missing_answer is not None and needing:
        e = task.missing_answer
        raise DataError(e.where, f"{e.why}; the reward {', '.join(needing)} compares completions with it",
                        f"{e.fix}, or use rewards that need no answer (a reward_model, a function)")


def fit_prompts(task, count: Callable[[list[dict]], int], budget: int, on_long: str) -> list[int]:
    """Keep the rows whose prompt fits in ``budget`` tokens (``data.on_long_prompt``: ``drop`` adds a
    warning with the counts to ``task.warnings``; ``error`` raises naming the first long row by its
    origin); returns the kept rows' prompt lengths. Raises :class:`DataError` when no training row
    is left."""
    before = list(task.train_origins or []) + list(task.eval_origins or [])
    task.train_rows, lengths, task.train_origins, dropped = fit_prompt_lengths(
        task.train_rows, count, budget, "data (training rows)", on_long, task.train_origins)
    task.eval_rows, more, task.eval_origins, dropped_eval = fit_prompt_lengths(
        task.eval_rows, count, budget, "data (held-out rows)", on_long, task.eval_origins)
    if dropped or dropped_eval:
        kept = set(task.train_origins or []) | set(task.eval_origins or [])
        gone = [o for o in before if o not in kept]
        named = (f": {'; '.join(gone[:MAX_NAMED])}" + (f" and {len(gone) - MAX_NAMED} more" if len(gone) > MAX_NAMED
                                                      else "")) if gone else ""
        task.warnings.append(f"dropped {dropped} training and {dropped_eval} held-out rows whose prompt is longer "
                             f"than the {budget} tokens the context leaves for it{named} (data.on_long_prompt: drop; "
                             "set it to error to stop instead)")
    if not task.train_rows:
        raise DataError("data", f"every training prompt is longer than the {budget} tokens the context leaves for "
                        "it", "shorten the prompts, lower data.few_shot or algorithm.sample.max_tokens")
    return lengths + more


def check_sampling_options(sample, honoured: frozenset, engine: str) -> None:
    """Raise :class:`ConfigError` when the ``sample`` component sets (to anything but its "off"
    value, :data:`~policyzoo.contract.SAMPLING_OPTIONS`) an option that ``engine`` does not name in
    ``honoured`` (its ``sampling_options``, which cover ``generate`` and ``generate_tokens``)."""
    for key, off in SAMPLING_OPTIONS.items():
        value = getattr(sample.params, key, off)
        if (tuple(value) if isinstance(value, list) else value) != off and key not in honoured:
            raise ConfigError(f"algorithm.sample.{key}", f"{key} = {value} but the {engine} engine takes no {key}",
                              f"set algorithm.sample.{key}: {'[]' if key == 'stop' else off}, or use an engine that "
                              "supports it")


def check_teacher(config, run, student) -> object | None:
    """The teacher's checked :class:`~policyzoo.engine.models.ModelInfo` (None without
    ``model.teacher``). Raises :class:`ConfigError` at ``model.teacher`` when its tokenizer's
    vocabulary (token -> id) differs from the student's ``student.tokenizer``, or when no component
    reads the teacher; at ``algorithm.term`` when a term ``needs_ref`` and no teacher is set;
    :class:`~policyzoo.engine.models.ModelError` for a bad folder (as ``model.path``)."""
    rules.check_teacher_keys(config, run)  # a term that needs the teacher, a teacher no one reads, kl
    path = config.model.teacher
    if path is None:
        return None
    teacher = resolve_model(path, config.model.trust_remote_code, where="model.teacher")
    mine, theirs = student.tokenizer.get_vocab(), teacher.tokenizer.get_vocab()
    if mine != theirs:
        differ = sorted(set(mine.items()) ^ set(theirs.items()), key=lambda kv: (kv[1], kv[0]))
        tok, idx = differ[0]
        side = "the student's" if mine.get(tok) == idx else "the teacher's"
        raise ConfigError("model.teacher", f"the teacher's tokenizer has another vocabulary than the student's "
                          f"({len(mine)} vs {len(theirs)} tokens; e.g. {tok!r} is id {idx} only in {side}): the "
                          "teacher would score other tokens than the student sampled",
                          "distil from a teacher with the student's tokenizer (the same model family)")
    return teacher


def check_ranks(prompts: int, ranks: int) -> None:
    """ConfigError when ``prompts`` (``train.prompts_per_step``) cannot be shared out among ``ranks``, naming
    the nearest multiples of ``ranks`` (below and above; the first two when none is below)."""
    if prompts % ranks == 0:
        return
    below = prompts // ranks * ranks
    near = [below, below + ranks] if below else [ranks, 2 * ranks]
    raise ConfigError("train.prompts_per_step", f"{prompts} prompts cannot be shared out in whole groups among "
                      f"{ranks} data-parallel ranks", f"use {near[0]} or {near[1]} (a multiple of {ranks}), or "
                      "launch another number of ranks")
