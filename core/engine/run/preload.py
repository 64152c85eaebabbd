"""The pre-load phase: every check a run makes before any weights load (config against the ranks,
plugin catalog, data, rewards, sampling options, trackers, DeepSpeed and device settings, model folder
and tokenizer, prompt lengths, run directory, checkpoint to resume and the components' saved state).
``Session.prepare`` and ``policyzoo train --dry-run`` both call :func:`preload`, so a dry run refuses
exactly what the run refuses before its models load (``tests/test_preflight.py`` enumerates them)."""

from __future__ import annotations

import json
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
from policyzoo.data.task import env_task
from policyzoo.engine import dist
from policyzoo.engine.device import check_device_options, check_gpu_visible
from policyzoo.engine.models import cache_dir, resolve_model
from policyzoo.engine.policy import LMPolicy
from policyzoo.engine.process import check_vllm_threads
from policyzoo.engine.report.tracking import check_trackers
from policyzoo.engine.rollout.server import connect as connect_servers
from policyzoo.engine.rollout.tensor_parallel import check_heads, check_tensor_parallel, local_world_size
from policyzoo.engine.rundir import ResumeError, RunDir
from policyzoo.engine.trainer.dsconfig import check_engine
from policyzoo.equivalence import notes_and_warnings, run_warnings
from policyzoo.errors import ConfigError
from policyzoo.resolve import resolve_algorithm, resolved_view
from policyzoo.step.episodes import encode_prompt

from . import gpu_fit, gpu_profile
from .checks import (
    check_answers,
    check_chat_template,
    check_sampling_options,
    check_teacher,
    filter_bias_warning,
    fit_prompts,
    sampling_warning,
    system_turn_warning,
)
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
    notes: list[str] = field(default_factory=list)  # the components' own lines for the dry run
    inert_notes: list[str] = field(default_factory=list)  # the gradient probe's lines on a zoo bundle (start-up)
    teacher: object = None
    servers: list = field(default_factory=list)  # engine.rollout: server, checked at connect
    #: the prompt-length count: seconds, prompts counted, prompts remembered from earlier runs (prompt_lengths.py)
    prompt_counts: dict = field(default_factory=dict)
    prompt_lengths: list[int] = field(default_factory=list)  # every prompt's tokens (train and held-out rows)
    #: the GPU profile's choices (gpu_profile.Choice; none on CPU) and the plan's verdict, for the console
    gpu_profile: list = field(default_factory=list)
    plan_lines: list[str] = field(default_factory=list)


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
    sp = run.sample.params
    model = resolve_model(config.model.path, config.model.trust_remote_code)  # folder, config, tokenizer
    check_heads(config.engine, model.path)  # vLLM TP k must divide the attention heads
    pre = _fit_model(config, task, run, model)
    _plan_profile(pre, config, profile, stage, ws)  # on a GPU: the plan's choices, then the fit (refused: exit 2)
    pre.teacher = check_teacher(config, run, model)  # same vocabulary, someone reads it
    if config.engine.rollout == "server":  # reachable, same versions, model and tokenizer: before any weights load
        pre.servers = connect_servers(config.engine.servers, model, config.engine.rollout_dtype or config.model.dtype,
                                      pre.max_model_len, token_file=config.engine.server_token_file)
    pre.settings, pre.task_rewards_n, pre.turn_tokens, pre.n = settings, len(rewards), sp.max_tokens, sp.n
    pre.warnings = [w for w in (system_turn_warning(model.tokenizer, task.train_rows),
                                sampling_warning(getattr(sp, "temperature", 1.0), sp.n),
                                filter_bias_warning(run, config.engine.overlap, config.engine.max_staleness))
                    if w] + pre.warnings
    # equal to its base, or a slot inert at these settings: a note on a slot the zoo's bundle holds as it is (grpo's
    # clip at one update per batch is its paper's setting), a warning on a slot the user changed
    pre.inert_notes, inert = notes_and_warnings(config, bundle, run_warnings(config, bundle, run.reward))
    pre.warnings += inert
    pre.notes = [line for comp in run.components() for line in comp.notes()]
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
    return PreLoad(task, run, None, model, 0, 0, 0, max_tokens, max_model_len, check_ids, resolved, fingerprint,
                   None, warnings=list(task.warnings), prompt_counts=counts, prompt_lengths=list(lengths))


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


def _device_profile(config) -> list:
    """GPUs torch cannot see refused (device.py); on a GPU (or one ``engine.plan_gpu`` plans) the profile's
    device choices (:func:`gpu_profile.apply_device`), returned. A real run of ``engine.plan_gpu`` on a CPU
    is refused before this, where it starts (``train.open_session``): a dry run plans it."""
    check_gpu_visible()
    chosen = gpu_profile.apply_device(config)
    if chosen:
        rules.check_config(config)  # the rules across sections, on the config with the profile's values
    return chosen


def _plan_profile(pre: PreLoad, config, profile: list, stage: int, ranks: int) -> None:
    """On a GPU: the planner's choices and the fit (:func:`gpu_fit.plan_and_check`, which refuses a step
    that does not fit), the resolved view made again with every choice and its ``gpu_profile`` section; on
    every device vLLM's batch limits against the context (:func:`gpu_fit.check_vllm_limits`)."""
    on_gpu = gpu_profile.on_gpu(config)
    if on_gpu:
        model_config = json.loads((Path(pre.model.path) / "config.json").read_text())
        step = gpu_fit.make_step(config, pre.run, model_config, pre.prompt_lengths, ranks, stage)
        chosen, pre.plan_lines = gpu_fit.plan_and_check(config, step)
        pre.gpu_profile = profile + chosen
        pre.resolved = resolved_view(config, pre.run)
        pre.resolved["gpu_profile"] = {c.key: {"value": c.value, "why": c.why} for c in pre.gpu_profile}
    gpu_fit.check_vllm_limits(config.engine, pre.max_model_len, on_gpu)


def _check_run_dir(pre: PreLoad, config, algo: str, resume, force_resume: bool, dry_run: bool) -> None:
    """The checkpoint to resume (and whether the config may continue it), or a new run folder."""
    if resume:
        pre.rundir = RunDir(resume)
        pre.rundir.check_live()
        found = pre.rundir.latest()
        if found is None:
            raise ResumeError(str(resume), "no complete checkpoint in this run directory",
                              "start a new run (drop --resume) in another --output-dir, or delete this folder "
                              "first; set train.save_every to save checkpoints")
        pre.resume_from, pre.state = found
        pre.resume_lines = check_resume(str(pre.resume_from), pre.state, config, pre.fingerprint,
                                        dist.world_size(), force_resume, str(resume))
        old_train = old_train_settings(pre.state, pre.rundir.path)
        pre.rows_drawn = rows_drawn(pre.state, old_train, config.train.prompts_per_step)
        pre.resume_notes = optimizer_notes(old_train, config)
        pre.run.load_state_dict(pre.state.get("components", {}), str(pre.resume_from))  # controllers' state
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
