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
* :func:`preload`: every check above and the others a run makes before any weights load (config
  against the ranks, plugin catalog, data, rewards, trackers, DeepSpeed config, model folder and
  tokenizer, prompt lengths, run directory, checkpoint to resume). ``Session.prepare`` and
  ``policyzoo train --dry-run`` both call it, so a dry run refuses exactly what the run refuses
  before its models load.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from policyzoo.assembly import Run, resolve_algorithm, resolved_view, reward_uses, step_settings
from policyzoo.catalog import get_catalog
from policyzoo.contract import SAMPLING_OPTIONS
from policyzoo.contract.untrusted import encode_text
from policyzoo.data import fit_prompt_lengths, load_task
from policyzoo.engine import dist
from policyzoo.engine.device import check_device_options
from policyzoo.engine.models import ModelError, resolve_model
from policyzoo.engine.policy import LMPolicy
from policyzoo.engine.process import check_vllm_threads
from policyzoo.engine.report.tracking import check_trackers
from policyzoo.engine.rundir import ResumeError, RunDir
from policyzoo.engine.trainer.dsconfig import check_engine
from policyzoo.errors import ConfigError, DataError
from policyzoo.step.episodes import encode_prompt

from .resume import (
    FINGERPRINT_KEYS,
    check_resume,
    lr_plan,
    old_train_settings,
    optimizer_notes,
    resume_schedule,
    rows_drawn,
)

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


@dataclass
class PreLoad:
    """What the checks made before any weights load (the attributes ``Session`` keeps)."""

    task: object
    run: Run
    settings: object
    model: object
    task_rewards_n: int
    turn_tokens: int
    n: int
    max_tokens: int
    max_model_len: int
    check_ids: list[int]
    resolved: dict
    fingerprint: dict
    rundir: RunDir
    resume_from: object = None
    state: dict = field(default_factory=lambda: {"step": 0, "batches": 0})
    rows_drawn: int = 0
    resume_notes: list[str] = field(default_factory=list)
    resume_lines: list[str] = field(default_factory=list)
    lr_plan: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def preload(config, resume: str | None = None, force_resume: bool = False, dry_run: bool = False) -> PreLoad:
    """Every check of a run before weights load (:func:`_preload`); Python warnings that policyzoo
    code issues meanwhile (a component's ``check``, e.g. a sequence-level ratio with a token-sum
    reduce) become the product's warnings (``PreLoad.warnings``: the ``warning:`` block, startup.log
    and summary.json), other libraries' warnings go on as before."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pre = _preload(config, resume, force_resume, dry_run)
    root = str(Path(__file__).resolve().parents[2])  # the policyzoo package
    for w in caught:
        if str(Path(w.filename).resolve()).startswith(root) and not issubclass(w.category, DeprecationWarning):
            if str(w.message) not in pre.warnings:
                pre.warnings.append(str(w.message))
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return pre


def _preload(config, resume: str | None, force_resume: bool, dry_run: bool) -> PreLoad:
    """Every check of a run before weights load, in the run's order; raises the first
    :class:`~policyzoo.errors.UserError` found. ``dry_run`` creates no run directory (its
    writability is checked on the nearest existing parent). The number of ranks is the launcher's
    (``WORLD_SIZE``, 1 without one), so a dry run under ``WORLD_SIZE=N`` checks the shares of N ranks."""
    ws = dist.world_size()
    if config.train.prompts_per_step % ws:
        raise ConfigError("train.prompts_per_step", f"{config.train.prompts_per_step} prompts cannot be shared "
                          f"out in whole groups among {ws} data-parallel ranks",
                          f"use a multiple of {ws}, or launch another number of ranks")
    if config.engine.rollout == "vllm":
        check_vllm_threads(config.engine.threads)
    dist.check_same_catalog(get_catalog())  # get_catalog raises for a broken plugin distribution
    task = load_task(config.data)
    bundle = resolve_algorithm(config.algorithm)
    rewards = reward_uses(config, task.default_rewards, bundle.env is not None)
    run = Run(bundle, rewards=rewards)
    check_answers(task, run)
    if config.engine.overlap != "none" and run.env is not None:
        raise ConfigError("engine.overlap", "one_step sampling ahead prefetches single-turn batches; the "
                          f"multi-turn episodes of the env '{run.env.name}' are not sampled ahead",
                          "set engine.overlap=none for runs with an env")
    check_trackers(config.train.report_to)
    check_sampling_options(run.sample, LMPolicy.sampling_options, config.engine.rollout)  # every path
    check_engine(config)  # the DeepSpeed settings
    check_device_options(config.engine)  # sleep mode on CPU, parallel_start on a GPU
    settings = step_settings(config, run)
    sp = run.sample.params
    model = resolve_model(config.model.path, config.model.trust_remote_code)  # folder, config, tokenizer
    pre = _fit_model(config, task, run, model)
    pre.settings, pre.task_rewards_n, pre.turn_tokens, pre.n = settings, len(rewards), sp.max_tokens, sp.n
    pre.warnings = [w for w in (system_turn_warning(model.tokenizer, task.train_rows),
                                sampling_warning(getattr(sp, "temperature", 1.0), sp.n)) if w] + pre.warnings
    _check_run_dir(pre, config, bundle.name, resume, force_resume, dry_run)
    return pre


def _fit_model(config, task, run, model) -> PreLoad:
    """The context budget, the chat template and every prompt's length against the model."""
    max_tokens = run.max_response_tokens  # the whole trajectory with an env
    budget = model.max_context - max_tokens
    if budget < 1:
        key = "algorithm.env.max_total_tokens" if run.env is not None else "algorithm.sample.max_tokens"
        raise ConfigError(key, f"{max_tokens} response tokens leave no room for a "
                          f"prompt in the model's {model.max_context}-token context", f"lower {key}")
    tok = model.tokenizer
    check_chat_template(tok, task.train_rows + task.eval_rows, f"model.path ({model.path})")
    count = lambda msgs: len(encode_prompt(tok, msgs))  # noqa: E731
    env = run.env  # an env may start its episodes from another prompt than the row's
    lengths = fit_prompts(task, (lambda msgs: count(env.env({"prompt": msgs}).prompt)) if env else count,
                          budget, config.data.on_long_prompt)
    max_model_len = min(model.max_context, max(lengths) + max_tokens + 8)
    row = (task.eval_rows or task.train_rows)[0]
    answer = encode_text(tok, str(row.get("answer", "")), False, "data (an answer)")[:max_tokens]
    check_ids = (encode_prompt(tok, row["prompt"]) + list(answer) + [model.eos_token_ids[0]])[:max_model_len]
    resolved = resolved_view(config, run)
    fingerprint = {k: resolved[k] for k in FINGERPRINT_KEYS}
    fingerprint["algorithm"] = fingerprint["algorithm"]["slots"]
    return PreLoad(task, run, None, model, 0, 0, 0, max_tokens, max_model_len, check_ids, resolved, fingerprint,
                   None, warnings=list(task.warnings))


def _check_run_dir(pre: PreLoad, config, algo: str, resume, force_resume: bool, dry_run: bool) -> None:
    """The checkpoint to resume (and whether the config may continue it), or a new run folder."""
    if resume:
        pre.rundir = RunDir(resume)
        pre.rundir.check_live()
        found = pre.rundir.latest()
        if found is None:
            raise ResumeError(str(resume), "no complete checkpoint in this run directory",
                              "start a new run (drop --resume), or set train.save_every to save checkpoints")
        pre.resume_from, pre.state = found
        pre.resume_lines = check_resume(str(pre.resume_from), pre.state, config, pre.fingerprint,
                                        dist.world_size(), force_resume, str(resume))
        old_train = old_train_settings(pre.state, pre.rundir.path)
        pre.rows_drawn = rows_drawn(pre.state, old_train, config.train.prompts_per_step)
        pre.resume_notes = optimizer_notes(old_train, config)
        pre.lr_plan, lines = resume_schedule(pre.state, config)
        pre.resume_lines += lines
        if not dry_run:
            pre.rundir.claim()
        return
    pre.lr_plan = lr_plan(config)
    out = dist.broadcast(config.output_dir or f"runs/{algo}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}")
    pre.rundir = RunDir(out)
    pre.rundir.check_live()
    if pre.rundir.latest() is not None:
        raise ResumeError(out, "this run directory already holds a run",
                          "pass --resume to continue it, or choose another --output-dir")
    pre.rundir.check_new(create=not dry_run)
    if not dry_run:
        pre.rundir.claim()
