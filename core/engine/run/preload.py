"""The pre-load phase: every check a run makes before any weights load (config against the ranks,
plugin catalog, data, rewards, sampling options, trackers, DeepSpeed and device settings, model folder
and tokenizer, prompt lengths, run directory, checkpoint to resume and the components' saved state).
``session.prepare`` and ``policyzoo train --dry-run`` both call :func:`preload`, so a dry run refuses
exactly what the run refuses before its models load (``tests/test_preflight.py`` enumerates them)."""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from policyzoo import rules
from policyzoo.assembly import Run, reward_uses, step_settings
from policyzoo.catalog import get_catalog
from policyzoo.contract.untrusted import encode_text
from policyzoo.data import load_task
from policyzoo.data.task import Task, env_task
from policyzoo.engine import dist
from policyzoo.engine.device import check_device_options, check_gpu_visible
from policyzoo.engine.lm_policy import LMPolicy
from policyzoo.engine.models import ModelInfo, cache_dir, resolve_model
from policyzoo.engine.process import check_vllm_threads
from policyzoo.engine.report.tracking import check_trackers
from policyzoo.engine.rollout.server import Server
from policyzoo.engine.rollout.server import connect as connect_servers
from policyzoo.engine.rollout.tensor_parallel import check_heads, check_tensor_parallel, local_world_size
from policyzoo.engine.rundir import ResumeError, RunDir
from policyzoo.engine.trainer.dsconfig import check_engine
from policyzoo.equivalence import notes_and_warnings, run_warnings
from policyzoo.errors import ConfigError
from policyzoo.resolve import resolve_algorithm, resolved_view
from policyzoo.step import StepSettings
from policyzoo.step.episodes import encode_prompt

from . import gpu_fit, gpu_profile
from .checks import (
    check_answers,
    check_chat_template,
    check_ranks,
    check_sampling_options,
    check_teacher,
    filter_bias_warning,
    fit_prompts,
    sampling_warning,
    system_turn_warning,
)
from .gpu_profile import Choice
from .prompt_lengths import LengthCache
from .resume import (
    FINGERPRINT_KEYS,
    check_resume,
    lr_plan,
    old_train_settings,
    optimizer_notes,
    resume_schedule,
    rows_drawn,
)


@dataclass(frozen=True)
class ModelFit:
    """The model against the data (:func:`_fit_model`): ``max_tokens`` (response tokens; the whole trajectory
    with an env), ``max_model_len`` (the context a sequence needs, tokens), ``check_ids`` (the sync check's
    sequence), the resolved view and its checkpoint ``fingerprint``, the prompt-length count's ``prompt_counts``
    (seconds, prompts counted, prompts remembered) and every prompt's tokens (``prompt_lengths``)."""

    max_tokens: int
    max_model_len: int
    check_ids: list[int]
    resolved: dict
    fingerprint: dict
    prompt_counts: dict
    prompt_lengths: list[int]


@dataclass(frozen=True)
class RunPlace:
    """Where the run writes and what it resumes (:func:`_check_run_dir`): its ``rundir``, the checkpoint
    folder ``resume_from`` (None: a new run) with its ``state`` (the run's counters ``{step, batches, ...}``),
    the training rows drawn so far, the console lines of the resume checks and the optimizer notes, and the
    learning-rate plan."""

    rundir: RunDir
    resume_from: Path | None = None
    state: dict = field(default_factory=lambda: {"step": 0, "batches": 0})
    rows_drawn: int = 0
    resume_notes: list[str] = field(default_factory=list)
    resume_lines: list[str] = field(default_factory=list)
    lr_plan: dict = field(default_factory=dict)


@dataclass
class PreLoad:
    """What the checks made before any weights load (:func:`preload`), built once from their results:
    the ``task`` (its rows), the assembled ``run`` (components), the step's ``settings``, the checked
    ``model`` folder (and ``teacher``: None without ``model.teacher``), the number of the task's own
    rewards, response tokens per turn and samples per prompt; the model against the data
    (:class:`ModelFit`'s fields); where the run writes and what it resumes (:class:`RunPlace`'s fields);
    the rollout ``servers`` (``engine.rollout: server``), the GPU profile's choices and the plan's lines;
    and the lines for the console: ``warnings`` (the ``warning:`` block; :func:`preload` adds the Python
    warnings the checks issued), ``notes`` (the components' own, for the dry run) and ``inert_notes``
    (the gradient probe's lines on a zoo bundle, at start-up)."""

    task: Task
    run: Run
    settings: StepSettings
    model: ModelInfo
    teacher: ModelInfo | None
    task_rewards_n: int
    turn_tokens: int
    n: int
    max_tokens: int
    max_model_len: int
    check_ids: list[int]
    resolved: dict
    fingerprint: dict
    prompt_counts: dict
    prompt_lengths: list[int]
    rundir: RunDir
    resume_from: Path | None
    state: dict
    rows_drawn: int
    resume_notes: list[str]
    resume_lines: list[str]
    lr_plan: dict
    servers: list[Server]
    gpu_profile: list[Choice]
    plan_lines: list[str]
    warnings: list[str]
    notes: list[str]
    inert_notes: list[str]


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
    check_ranks(config.train.prompts_per_step, ws)
    profile = _device_profile(config)  # on a GPU: the profile's device choices (gpu_profile.py)
    if config.engine.rollout == "vllm":
        check_vllm_threads(config.engine.threads)
    dist.check_same_catalog(get_catalog())  # get_catalog raises for a broken plugin distribution
    task = load_task(config.data)
    bundle = resolve_algorithm(config.algorithm)
    rewards = reward_uses(config, task.default_rewards, bundle.env is not None)
    run = Run(bundle, rewards=rewards)
    own = run.env.task_rows(config.data) if run.env is not None else None
    if own is not None:  # an env with its own data set (verifiers) replaces data:
        task = env_task(run.env.name, *own, config.data.seed)
    check_answers(task, run)
    rules.check_run(config, run)  # overlap, staleness and the env (policyzoo.rules)
    check_trackers(config.train.report_to)
    check_sampling_options(run.sample, LMPolicy.sampling_options, config.engine.rollout)  # every path
    stage = check_engine(config)  # the DeepSpeed settings
    check_device_options(config.engine, gpu_profile.on_gpu(config))  # sleep mode on CPU, parallel_start on a GPU
    check_tensor_parallel(config.engine, ws, env=run.env is not None, local_world=local_world_size(),
                          resamples=any(f.params.resample for f in run.filter))
    settings = step_settings(config, run)
    model = resolve_model(config.model.path, config.model.trust_remote_code)  # folder, config, tokenizer
    check_heads(config.engine, model.path)  # vLLM TP k must divide the attention heads
    fit = _fit_model(config, task, run, model)
    # on a GPU: the plan's choices, then the fit (refused: exit 2)
    chosen, plan_lines, resolved = gpu_fit.plan_profile(config, run, model.path, fit, profile, stage, ws)
    teacher = check_teacher(config, run, model)  # same vocabulary, someone reads it
    servers = [] if config.engine.rollout != "server" else connect_servers(  # reachable, same versions, model and
        config.engine.servers, model, config.engine.rollout_dtype or config.model.dtype,  # tokenizer: before any
        fit.max_model_len, token_file=config.engine.server_token_file)  # weights load
    warned, inert_notes = _warnings(config, task, run, bundle, model)
    notes = [line for comp in run.components() for line in comp.notes()]
    place = _check_run_dir(config, bundle.name, run, fit.fingerprint, resume, force_resume, dry_run)
    sp = run.sample.params
    return PreLoad(task=task, run=run, settings=settings, model=model, teacher=teacher, task_rewards_n=len(rewards),
                   turn_tokens=sp.max_tokens, n=sp.n, max_tokens=fit.max_tokens, max_model_len=fit.max_model_len,
                   check_ids=fit.check_ids, resolved=resolved, fingerprint=fit.fingerprint,
                   prompt_counts=fit.prompt_counts, prompt_lengths=fit.prompt_lengths, rundir=place.rundir,
                   resume_from=place.resume_from, state=place.state, rows_drawn=place.rows_drawn,
                   resume_notes=place.resume_notes, resume_lines=place.resume_lines, lr_plan=place.lr_plan,
                   servers=servers, gpu_profile=chosen, plan_lines=plan_lines, warnings=warned, notes=notes,
                   inert_notes=inert_notes)


def _warnings(config, task, run, bundle, model) -> tuple[list[str], list[str]]:
    """The run's warnings found before load (the data's, a system turn the template drops, sampling, a
    filter's bias, slots inert at these settings) and the notes on the zoo bundle's inert slots."""
    sp = run.sample.params
    warned = [w for w in (system_turn_warning(model.tokenizer, task.train_rows),
                          sampling_warning(getattr(sp, "temperature", 1.0), sp.n),
                          filter_bias_warning(run, config.engine.overlap, config.engine.max_staleness)) if w]
    # equal to its base, or a slot inert at these settings: a note on a slot the zoo's bundle holds as it is (grpo's
    # clip at one update per batch is its paper's setting), a warning on a slot the user changed
    inert_notes, inert = notes_and_warnings(config, bundle, run_warnings(config, bundle, run.reward))
    return warned + list(task.warnings) + inert, inert_notes


def _fit_model(config, task, run, model) -> ModelFit:
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
    cache = LengthCache(tok, cache_dir())  # the counts of earlier runs (same tokenizer and rules)
    rows, t0 = len(task.train_rows) + len(task.eval_rows), time.perf_counter()
    try:
        lengths = fit_prompts(task, (lambda msgs: count(env.env({"prompt": msgs}).prompt)) if env
                              else cache.wrap(count), budget, config.data.on_long_prompt)
    finally:
        cache.save()
    counts = {"seconds": time.perf_counter() - t0, "counted": rows - cache.remembered, "remembered": cache.remembered}
    max_model_len = min(model.max_context, max(lengths) + max_tokens + 8)
    row = (task.eval_rows or task.train_rows)[0]
    answer = encode_text(tok, str(row.get("answer", "")), False, "data (an answer)")[:max_tokens]
    check_ids = (encode_prompt(tok, row["prompt"]) + list(answer) + [model.eos_token_ids[0]])[:max_model_len]
    resolved = resolved_view(config, run)
    fingerprint = {k: resolved[k] for k in FINGERPRINT_KEYS}
    fingerprint["algorithm"] = dict(fingerprint["algorithm"]["slots"])
    if not fingerprint["algorithm"]["term"]["components"]:  # as checkpoints from before the term slot
        del fingerprint["algorithm"]["term"]
    return ModelFit(max_tokens=max_tokens, max_model_len=max_model_len, check_ids=check_ids, resolved=resolved,
                    fingerprint=fingerprint, prompt_counts=counts, prompt_lengths=list(lengths))


def _device_profile(config) -> list:
    """GPUs torch cannot see refused (device.py); on a GPU (or one ``engine.plan_gpu`` plans) the profile's
    device choices (:func:`gpu_profile.apply_device`), returned. A real run of ``engine.plan_gpu`` on a CPU
    is refused before this, where it starts (``train.open_run``): a dry run plans it."""
    check_gpu_visible()
    chosen = gpu_profile.apply_device(config)
    if chosen:
        rules.check_config(config)  # the rules across sections, on the config with the profile's values
    return chosen


def _check_run_dir(config, algo: str, run: Run, fingerprint: dict, resume, force_resume: bool,
                   dry_run: bool) -> RunPlace:
    """The checkpoint to resume (and whether the config may continue it; the components' saved state is
    loaded into ``run``), or a new run folder."""
    if resume:
        rundir = RunDir(resume)
        rundir.check_live()
        found = rundir.latest()
        if found is None:
            raise ResumeError(str(resume), "no complete checkpoint in this run directory",
                              "start a new run (drop --resume) in another --output-dir, or delete this folder "
                              "first; set train.save_every to save checkpoints")
        resume_from, state = found
        resume_lines = check_resume(str(resume_from), state, config, fingerprint, dist.world_size(), force_resume,
                                    str(resume))
        old_train = old_train_settings(state, rundir.path)
        run.load_state_dict(state.get("components", {}), str(resume_from))  # controllers' state
        plan, lines = resume_schedule(state, config)
        if not dry_run:
            rundir.claim()
        return RunPlace(rundir, resume_from, state, rows_drawn(state, old_train, config.train.prompts_per_step),
                        optimizer_notes(old_train, config), resume_lines + lines, plan)
    folder = algo.replace("/", "_")[:120]  # a hybrid's name names its changes: one folder, within a name's limit
    out = dist.broadcast(config.output_dir or f"runs/{folder}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}")
    rundir = RunDir(out)
    rundir.check_live()
    if rundir.latest() is not None:
        raise ResumeError(out, "this run directory already holds a run",
                          "pass --resume to continue it, or choose another --output-dir")
    rundir.check_new(create=not dry_run)
    if not dry_run:
        rundir.claim()
    return RunPlace(rundir, lr_plan=lr_plan(config))
