"""Every rule that relates keys of different config sections (or a config key and the chosen components),
in one place: each :class:`Rule` has a name, the keys it relates and its error text (docs/config-rules.md
lists them; ``tests/test_rules.py`` keeps that table equal to :data:`RULES`).

Three kinds, by what they need and so where they are raised, all before any weights load:

* ``"config"`` rules read the config alone; :class:`~policyzoo.run_config.Config`'s validator calls
  :func:`check_config`, so they fail at ``load_config`` (a ``ValueError`` whose text before ``': '`` is
  the reason and after it the fix, turned into a :class:`ConfigError` by ``run_config.py``).
* ``"run"`` rules also read the assembled run (its env, kl, terms); ``run/preload.py`` calls
  :func:`check_run` after assembly and ``run/checks.py`` ``check_teacher`` calls :func:`check_teacher_keys`
  before the teacher's folder is read. They raise :class:`ConfigError` at the rule's first key.
* ``"tensor_parallel"`` rules hold for a vLLM engine shared by k > 1 ranks; ``rollout/tensor_parallel.py``
  calls :func:`check_tensor_parallel_keys` (from ``preload``) after its checks of k against the ranks.

A check returns None when the rule holds, else ``(why, fix)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .errors import ConfigError


@dataclass(frozen=True)
class Rule:
    """One cross-section rule: ``keys`` it relates (the first is where a ``"run"`` rule's error points),
    ``text`` its error text as the docs show it, ``check(config[, run]) -> (why, fix) | None``."""

    name: str
    kind: str  # "config" or "run"
    keys: tuple[str, ...]
    text: str
    check: Callable


def _micro_batches(c):
    if c.train.max_tokens_per_micro_batch and c.train.micro_batches > 1:
        return ("train.micro_batches and train.max_tokens_per_micro_batch both set the micro-batches",
                "set only one of them")
    return None


def _autocast_dtype(c):
    if c.train.autocast and c.model.dtype != "float32":
        return ("train.autocast computes in bf16 over fp32 weights, but model.dtype is already "
                f"{c.model.dtype}", "set model.dtype=float32, or train.autocast=false")
    return None


def _compile_vllm(c):
    if c.engine.vllm_compile and c.engine.rollout != "vllm":
        return (f"engine.vllm_compile compiles the colocated vLLM engine's forward, but engine.rollout is "
                f"{c.engine.rollout}", "set engine.rollout=vllm, or drop engine.vllm_compile")
    return None


def _fp32_head_vllm(c):
    if c.engine.fp32_lm_head and c.engine.rollout != "vllm":
        return (f"engine.fp32_lm_head asks the colocated vLLM engine for fp32 logits, but engine.rollout is "
                f"{c.engine.rollout}", "set engine.rollout=vllm, or drop engine.fp32_lm_head")
    return None


def _fp32_head_trainer(c):
    if c.engine.fp32_lm_head and c.model.dtype != "float32":
        return (f"engine.fp32_lm_head computes the sampler's logits in fp32 as an fp32 trainer does, but model.dtype "
                f"is {c.model.dtype}", "drop engine.fp32_lm_head, or set model.dtype=float32")
    return None


def _fp32_head_rollout(c):
    """Not for ``engine.rollout_dtype: auto``: it chose float32 on a CPU without bf16 instructions, where the
    same config samples in bf16 elsewhere (:func:`policyzoo.native_bf16.rollout_dtype_notes` says it is idle)."""
    e, auto = c.engine, getattr(c, "_auto_rollout_dtype", False)
    if e.fp32_lm_head and (e.rollout_dtype or c.model.dtype) == "float32" and not auto:
        return ("engine.fp32_lm_head computes vLLM's logits in fp32 over bf16 weights, but engine.rollout_dtype is "
                "float32 (its logits are fp32 already)",
                "set engine.rollout_dtype=bfloat16 (or auto: bf16 where the CPU has bf16 instructions), or drop "
                "engine.fp32_lm_head")
    return None


def _bf16_zero(c):
    if c.model.dtype == "bfloat16" and c.engine.zero_stage == 0:
        return ("model.dtype bfloat16 needs engine.zero_stage >= 1 (DeepSpeed's bf16 at ZeRO 0 trains differently "
                "from fp32 on this version)", "set engine.zero_stage=1, or model.dtype=float32")
    return None


def _overlap_env(c, run):
    if c.engine.overlap != "none" and run.env is not None:
        return ("one_step sampling ahead prefetches single-turn batches; the multi-turn episodes of the env "
                f"'{run.env.name}' are not sampled ahead", "set engine.overlap=none for runs with an env")
    return None


def _staleness_overlap(c, run):
    s = c.engine.max_staleness
    if s and c.engine.overlap != "none":
        return (f"engine.overlap={c.engine.overlap} and engine.max_staleness={s} both sample ahead",
                "keep one: engine.max_staleness=1 samples continuously, also across checkpoints (what is in flight "
                "at a checkpoint is sampled again on resume); engine.overlap=one_step stops at checkpoints, so a "
                "resume replays exactly")
    return None


def _staleness_env(c, run):
    if c.engine.max_staleness and run.env is not None:
        return (f"asynchronous sampling prefetches single-turn batches; the multi-turn episodes of the env "
                f"'{run.env.name}' are not sampled ahead", "set engine.max_staleness=0 for runs with an env")
    return None


def _readers(run) -> list[str]:
    return [t.name for t in run.term if getattr(t, "needs_ref", False)]


def _term_needs_teacher(c, run):
    readers = _readers(run)
    if c.model.teacher is None and readers:
        return (f"the term {readers[0]!r} distils from a teacher, but model.teacher is not set (the reference would "
                "be the initial policy itself)",
                "set model.teacher to the teacher's model folder (same tokenizer as model.path)")
    return None


def _teacher_needs_reader(c, run):
    if c.model.teacher is not None and not _readers(run):
        return ("a teacher is set but no component reads it", "add the distillation term (algorithm.term: "
                "[{use: distill}], or --algo distill), or drop model.teacher")
    return None


def _teacher_without_kl(c, run):
    if c.model.teacher is not None and run.kl is not None:
        return (f"with a teacher the reference log-probs are the teacher's, so the kl component {run.kl.name!r} "
                "would measure the KL to the teacher, not to the initial policy",
                "set algorithm.kl to null (the distill bundle does), or drop model.teacher")
    return None


def _tp(bad: bool, why: str, fix: str):
    return (why, fix) if bad else None


def _tp_overlap(e, env, resamples):
    return _tp(e.overlap != "none", "engine.overlap=one_step samples in a thread while the trainer's collectives run",
               "set engine.overlap=none")


def _tp_staleness(e, env, resamples):
    return _tp(e.max_staleness > 0, "engine.max_staleness >= 1 samples in a thread whose timing, and so whether it "
               "or the trainer samples a step, differs between the ranks of a group",
               "set engine.max_staleness=0 (or use the rollout server for asynchronous training)")


def _tp_parallel_start(e, env, resamples):
    return _tp(e.parallel_start, "engine.parallel_start starts vLLM (its group collectives) in a thread while "
               "DeepSpeed starts (its own)", "set engine.parallel_start=false")


def _tp_env(e, env, resamples):
    return _tp(env, "multi-turn episodes call the engine once per turn and turn counts differ between ranks",
               "set engine.vllm_tensor_parallel_size=1 for runs with an env")


def _tp_resample(e, env, resamples):
    return _tp(resamples, "dynamic sampling resamples on the ranks whose groups were filtered out, so ranks call "
               "the engine different numbers of times",
               "set engine.vllm_tensor_parallel_size=1, or use a filter without resample")


_TP_TEXT = "{k}: every rank of a group must call the shared engine the same number of times, but "


RULES: dict[str, Rule] = {r.name: r for r in (
    Rule("one_micro_batch_rule", "config", ("train.micro_batches", "train.max_tokens_per_micro_batch"),
         "train.micro_batches and train.max_tokens_per_micro_batch both set the micro-batches", _micro_batches),
    Rule("autocast_needs_fp32", "config", ("train.autocast", "model.dtype"),
         "train.autocast computes in bf16 over fp32 weights, but model.dtype is already {dtype}", _autocast_dtype),
    Rule("compile_needs_vllm", "config", ("engine.vllm_compile", "engine.rollout"),
         "engine.vllm_compile compiles the colocated vLLM engine's forward, but engine.rollout is {rollout}",
         _compile_vllm),
    Rule("bf16_needs_zero", "config", ("model.dtype", "engine.zero_stage"),
         "model.dtype bfloat16 needs engine.zero_stage >= 1", _bf16_zero),
    Rule("fp32_head_needs_vllm", "config", ("engine.fp32_lm_head", "engine.rollout"),
         "engine.fp32_lm_head asks the colocated vLLM engine for fp32 logits, but engine.rollout is {rollout}",
         _fp32_head_vllm),
    Rule("fp32_head_needs_fp32_trainer", "config", ("engine.fp32_lm_head", "model.dtype"),
         "engine.fp32_lm_head computes the sampler's logits in fp32 as an fp32 trainer does, but model.dtype is "
         "{dtype}", _fp32_head_trainer),
    Rule("fp32_head_needs_bf16_rollout", "config", ("engine.fp32_lm_head", "engine.rollout_dtype"),
         "engine.fp32_lm_head computes vLLM's logits in fp32 over bf16 weights, but engine.rollout_dtype is float32",
         _fp32_head_rollout),
    Rule("overlap_without_env", "run", ("engine.overlap", "algorithm.env"),
         "one_step sampling ahead prefetches single-turn batches; the multi-turn episodes of the env ... are not "
         "sampled ahead", _overlap_env),
    Rule("staleness_or_overlap", "run", ("engine.max_staleness", "engine.overlap"),
         "engine.overlap={overlap} and engine.max_staleness={s} both sample ahead", _staleness_overlap),
    Rule("staleness_without_env", "run", ("engine.max_staleness", "algorithm.env"),
         "asynchronous sampling prefetches single-turn batches; the multi-turn episodes of the env ... are not "
         "sampled ahead", _staleness_env),
    Rule("term_needs_teacher", "run", ("algorithm.term", "model.teacher"),
         "the term {name} distils from a teacher, but model.teacher is not set", _term_needs_teacher),
    Rule("teacher_needs_reader", "run", ("model.teacher", "algorithm.term"),
         "a teacher is set but no component reads it", _teacher_needs_reader),
    Rule("teacher_without_kl", "run", ("model.teacher", "algorithm.kl"),
         "with a teacher the reference log-probs are the teacher's, so the kl component {name} would measure the "
         "KL to the teacher", _teacher_without_kl),
    Rule("tp_without_overlap", "tensor_parallel", ("engine.vllm_tensor_parallel_size", "engine.overlap"),
         _TP_TEXT + "engine.overlap=one_step samples in a thread ...", _tp_overlap),
    Rule("tp_without_staleness", "tensor_parallel", ("engine.vllm_tensor_parallel_size", "engine.max_staleness"),
         _TP_TEXT + "engine.max_staleness >= 1 samples in a thread ...", _tp_staleness),
    Rule("tp_without_parallel_start", "tensor_parallel",
         ("engine.vllm_tensor_parallel_size", "engine.parallel_start"),
         _TP_TEXT + "engine.parallel_start starts vLLM ... in a thread while DeepSpeed starts", _tp_parallel_start),
    Rule("tp_without_env", "tensor_parallel", ("engine.vllm_tensor_parallel_size", "algorithm.env"),
         _TP_TEXT + "multi-turn episodes call the engine once per turn ...", _tp_env),
    Rule("tp_without_resample", "tensor_parallel", ("engine.vllm_tensor_parallel_size", "algorithm.filter"),
         _TP_TEXT + "dynamic sampling resamples on the ranks whose groups were filtered out ...", _tp_resample),
)}
#: the teacher rules, checked by ``check_teacher`` just before the teacher's folder is read
TEACHER = ("term_needs_teacher", "teacher_needs_reader", "teacher_without_kl")


def check_config(config) -> None:
    """Every ``"config"`` rule on a :class:`~policyzoo.run_config.Config`, in :data:`RULES` order. Raises
    ``ValueError("WHY: FIX")`` for the first broken one (pydantic turns it into the config's error)."""
    for rule in RULES.values():
        found = rule.check(config) if rule.kind == "config" else None
        if found:
            raise ValueError(": ".join(found))


def _raise_run_rules(config, run, names) -> None:
    for name in names:
        rule = RULES[name]
        found = rule.check(config, run)
        if found:
            raise ConfigError(rule.keys[0], *found)


def check_run(config, run) -> None:
    """Every ``"run"`` rule but the teacher's on a config and its assembled
    :class:`~policyzoo.assembly.Run`; raises :class:`ConfigError` at the first broken rule's first key."""
    _raise_run_rules(config, run, [n for n, r in RULES.items() if r.kind == "run" and n not in TEACHER])


def check_tensor_parallel_keys(engine, env: bool, resamples: bool) -> None:
    """The ``"tensor_parallel"`` rules for ``engine.vllm_tensor_parallel_size`` k > 1 (``engine``: the config's
    engine section; ``env``: the run has an env; ``resamples``: a filter resamples), called by
    ``rollout/tensor_parallel.py`` ``check_tensor_parallel`` after its checks of k against the ranks. Raises
    :class:`ConfigError` at ``engine.vllm_tensor_parallel_size`` for the first broken one."""
    k = engine.vllm_tensor_parallel_size
    for rule in RULES.values():
        found = rule.check(engine, env, resamples) if rule.kind == "tensor_parallel" else None
        if found:
            raise ConfigError(rule.keys[0], _TP_TEXT.format(k=k) + found[0], found[1])


def check_teacher_keys(config, run) -> None:
    """The teacher rules (:data:`TEACHER`), before the teacher's folder is read; raises :class:`ConfigError`."""
    _raise_run_rules(config, run, TEACHER)
