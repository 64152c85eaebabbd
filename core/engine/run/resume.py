"""What a checkpoint records about its run, and the checks made before it is resumed.

``state.json`` of every checkpoint (see :mod:`policyzoo.engine.rundir`) holds::

    step              optimizer steps done
    rows              training rows drawn so far (the position in the shuffled row stream)
    batches           draws of P rows so far (kept for readers of older checkpoints)
    fingerprint       the algorithm slots, rewards, model and data sections it was trained with
    zero_stage        the ZeRO stage it was written at (engine.deepspeed's stage when set, else engine.zero_stage)
    world_size        number of data-parallel ranks that wrote it
    train             {lr, weight_decay, prompts_per_step, critic_lr} it was trained with
    schedule          the learning-rate schedule: name, warmup_steps, total_steps (the horizon, in
                      optimizer steps), from_step, from_factor (a re-planned one) and done (the
                      optimizer steps it counted)
    components        {key: state} of every stateful component (``Run.state_dict``: e.g. an adaptive
                      KL coefficient), restored exactly on resume (``Run.load_state_dict``)
    rollout_dtype     the dtype it sampled in (engine.rollout_dtype, else model.dtype)

All checks run in ``session.prepare``, before DeepSpeed or vLLM start, and raise
:class:`~policyzoo.engine.rundir.ResumeError` naming the real reason:

* train.steps not above the checkpoint's step (resuming would rewind the run);
* a ZeRO stage with another checkpoint layout (:data:`LAYOUT`: stages 1 and 2 interchange), or
  (at stage >= 1, whose optimizer state is split among the ranks) another number of ranks:
  DeepSpeed's own error comes only after both engines started and reads as a missing file.
  Converting (DeepSpeed's universal checkpoint) is not attempted;
* another algorithm / reward / model / data config (the ``fingerprint``): the message lists every
  key that differs with its old and new value (``--force-resume`` loads anyway).
  Keys that ``engine.rollout_correction`` changed (its ratio, added because ``engine.rollout_dtype``
  now differs from ``model.dtype``) are named as such, with ``engine.rollout_correction=null`` as the
  way to keep the checkpoint's algorithm. The reverse, a run that sampled in another dtype with the
  correction resumed sampling in ``model.dtype``, keeps the checkpoint's algorithm (the correction's
  ratio, near 1 now) and says so (:func:`kept_correction_note`).

``train.*`` may change on resume. A changed learning rate or weight decay is applied to the
restored optimizer (DeepSpeed restores the saved values with the Adam moments otherwise), and
a changed ``train.prompts_per_step`` continues the row stream where the checkpoint left it.
The learning-rate schedule is the checkpoint's (:func:`resume_schedule`): kept when its horizon and
type are the configured ones, else re-planned from the factor it has reached (never rebuilt on the
new horizon from step 0, which made the lr jump); either way the lr of the next update is printed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import yaml

from policyzoo.config_sections import critic_lr
from policyzoo.engine import dist
from policyzoo.engine.rundir import ResumeError
from policyzoo.engine.trainer.dsconfig import effective_stage
from policyzoo.engine.trainer.modeling import LRSchedule
from policyzoo.errors import TrainingError

#: what a checkpoint must share with the config it is resumed with (train.* and engine.* may change)
FINGERPRINT_KEYS = ("algorithm", "rewards", "model", "data")
#: DeepSpeed's checkpoint layout per ZeRO stage: stage 0 keeps the optimizer state with the weights,
#: stages 1 and 2 (one optimizer class) in per-rank partitions, stage 3 partitions the weights too.
#: Measured with DeepSpeed 0.19: 1 <-> 2 load and continue exactly; 0 -> 1, 2 -> 3, 3 -> 2 fail.
LAYOUT = {0: "0", 1: "1-2", 2: "1-2", 3: "3"}
MAX_LISTED = 12


def checkpoint_state(step: int, rows: int, batches: int, fingerprint: dict, config, world_size: int,
                     schedule: dict | None = None) -> dict:
    """The ``state.json`` of a checkpoint (see the module docstring)."""
    t = config.train
    return {"step": step, "rows": rows, "batches": batches, "fingerprint": fingerprint, "schedule": schedule or {},
            "zero_stage": effective_stage(config.engine), "world_size": world_size,
            "rollout_dtype": config.engine.rollout_dtype or config.model.dtype,
            "train": {"lr": t.lr, "weight_decay": t.weight_decay, "prompts_per_step": t.prompts_per_step,
                      "critic_lr": critic_lr(config.engine, t)}}


def write_checkpoint(part, step: int, batches: int, rows: int, tokens_seen: int = 0, in_flight: dict | None = None,
                     export: bool = False) -> Path:
    """Write the checkpoint of ``step`` (``batches`` drawn, ``rows`` prompts drawn; ``in_flight``: what
    was sampled ahead, see :func:`~policyzoo.engine.run.batch_sources.async_sampler`) with ``part``'
    ``trainer``, ``rundir``, ``config``, ``fingerprint`` and ``run`` (its components' state, e.g. an
    adaptive KL coefficient); with ``export`` also a save_pretrained export in its ``hf/`` folder.
    Returns the checkpoint folder. Raises :class:`~policyzoo.errors.TrainingError` when the weights
    hold NaN/inf (nothing is written over the last good checkpoint)."""
    if not part.trainer.weights_finite():  # never write NaN/inf weights over a good checkpoint
        latest = part.rundir.latest()
        raise TrainingError(f"step {step}", "the trained weights hold NaN or inf values; no checkpoint was "
                            f"written (last complete checkpoint: {latest[0] if latest else 'none'})",
                            "lower train.lr or train.grad_clip, then resume from the last checkpoint")
    state = checkpoint_state(step, rows, batches, part.fingerprint, part.config, dist.world_size(),
                             part.trainer.schedule_state())
    state["tokens_seen"] = tokens_seen
    state["components"] = part.run.state_dict()
    if in_flight is not None:  # sampled ahead, on every rank: not in the checkpoint
        state["async_in_flight"] = in_flight
    return part.rundir.save_checkpoint(part.trainer, step, state, part.config.engine.keep_checkpoints, export)


def flatten(tree, prefix: str = "") -> dict:
    """``{"a": {"b": 1}, "c": [x, y]}`` -> ``{"a.b": 1, "c[0]": x, "c[1]": y}``."""
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out or {prefix: {}}
    if isinstance(tree, list):
        out = {}
        for i, v in enumerate(tree):
            out.update(flatten(v, f"{prefix}[{i}]"))
        return out or {prefix: []}
    return {prefix: tree}


def config_diff(old, new) -> list[str]:
    """Every dotted key whose value differs: ``"key: OLD -> NEW"`` (``(absent)`` for a missing key).
    Both sides are compared as JSON would store them (a tuple equals a list)."""
    a, b = (flatten(json.loads(json.dumps(x, default=str))) for x in (old, new))
    missing = object()

    def show(v) -> str:
        return "(absent)" if v is missing else json.dumps(v)
    return [f"{k}: {show(a.get(k, missing))} -> {show(b.get(k, missing))}"
            for k in sorted(set(a) | set(b)) if a.get(k, missing) != b.get(k, missing)]


def _run_config(run_dir: Path, section: str) -> dict:
    """A section of the run directory's ``config.yaml`` (still the config of the checkpoint's run when
    the checks read it), for checkpoints written before ``state.json`` recorded what is asked."""
    try:
        tree = yaml.safe_load((Path(run_dir) / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}
    return tree.get(section) or {} if isinstance(tree, dict) else {}


def old_train_settings(state: dict, run_dir: Path) -> dict:
    """The checkpoint's ``train`` record; for checkpoints written before it existed, the run
    directory's ``config.yaml``."""
    if "train" in state:
        return state["train"]
    t = _run_config(run_dir, "train")
    return {k: t[k] for k in ("lr", "weight_decay", "prompts_per_step") if k in t}


def kept_correction_note(state: dict, config, run_dir: Path) -> list[str]:
    """One console line when the checkpoint sampled in another dtype than ``model.dtype`` with the rollout
    correction as its ratio and the resume samples in ``model.dtype``: the checkpoint's algorithm, and so
    the correction, stays (over one dtype its weights are near 1); a new run would not add it."""
    old = state.get("rollout_dtype") or _run_config(run_dir, "engine").get("rollout_dtype")
    e, dtype, algo = config.engine, config.model.dtype, config.algorithm
    ratio = (algo.get("ratio") or {}).get("use") if isinstance(algo, dict) else None
    if old in (None, dtype) or (e.rollout_dtype or dtype) != dtype or not ratio or ratio != e.rollout_correction:
        return []
    return [f"resume: the checkpoint sampled in {old} with algorithm.ratio {ratio}, the correction "
            f"engine.rollout_correction adds for a rollout in another dtype than model.dtype; sampling in {dtype} "
            f"now, the checkpoint's algorithm is kept, so {ratio} stays on (its weights are near 1 over one dtype; "
            "a new run with these settings would not add it)"]


def _correction_keys(config, diff: list[str]) -> tuple[str, str] | None:
    """``(why, fix)`` when some of ``diff``'s keys are the ratio the config's validator added for
    ``engine.rollout_correction`` (a rollout dtype other than ``model.dtype``), else None."""
    e = config.engine
    if not (getattr(config, "_correction_added", False) and any(d.startswith("algorithm.ratio.") for d in diff)):
        return None
    return (f"algorithm.ratio was added by engine.rollout_correction={e.rollout_correction} because "
            f"engine.rollout_dtype ({e.rollout_dtype}) differs from model.dtype ({config.model.dtype})",
            f"engine.rollout_correction=null keeps the checkpoint's algorithm (sampling in {e.rollout_dtype} "
            f"without a correction), or --force-resume trains on with {e.rollout_correction} as the ratio")


def rows_drawn(state: dict, old_train: dict, prompts_per_step: int) -> int:
    """Training rows drawn before the checkpoint (older checkpoints count batches of P rows)."""
    if "rows" in state:
        return int(state["rows"])
    return int(state.get("batches", 0)) * int(old_train.get("prompts_per_step", prompts_per_step))


def check_resume(where: str, state: dict, config, fingerprint: dict, world_size: int, force: bool,
                 run_dir: str = "RUN_DIR") -> list[str]:
    """Raise :class:`ResumeError` if the checkpoint ``state`` cannot continue with ``config`` on
    ``world_size`` ranks; return notes for the console (e.g. what ``--force-resume`` overrode, a rollout
    correction kept, :func:`kept_correction_note`). ``run_dir``: the run directory."""
    step = state["step"]
    if config.train.steps <= step:
        raise ResumeError(where, f"the run is already at step {step} and train.steps is {config.train.steps}: "
                          "resuming would rewind it and overwrite its checkpoints",
                          f"set train.steps above {step}, e.g. `policyzoo train --resume {run_dir} "
                          f"train.steps={step + 10}`")
    stage, ranks = state.get("zero_stage"), state.get("world_size")
    now = effective_stage(config.engine)
    if stage is not None and LAYOUT[stage] != LAYOUT[now]:
        same = " or ".join(str(s) for s in sorted(LAYOUT) if LAYOUT[s] == LAYOUT[stage])
        key = "engine.zero_stage" if now == config.engine.zero_stage else "engine.deepspeed.zero_optimization.stage"
        raise ResumeError(where, f"the checkpoint was written at ZeRO stage {stage} and {key} is {now}: "
                          "DeepSpeed saves the weights and optimizer state in another "
                          "layout at each of stage 0, stages 1-2 and stage 3, and cannot load one in another",
                          f"resume with the checkpoint's stage: {key}={same} (a user DeepSpeed config's "
                          "zero_optimization.stage wins over engine.zero_stage)")
    if ranks is not None and ranks != world_size and (stage or 0) >= 1:
        raise ResumeError(where, f"the checkpoint was written by {ranks} data-parallel rank(s) at ZeRO stage "
                          f"{stage}, which splits the optimizer state among the ranks, and this run has "
                          f"{world_size}", f"launch {ranks} rank(s) to resume it (ZeRO stage 0 checkpoints "
                          "load on any number of ranks)")
    diff = config_diff(state.get("fingerprint"), fingerprint)
    if not diff:
        return kept_correction_note(state, config, Path(run_dir))
    listed = [f"  {d}" for d in diff[:MAX_LISTED]] + ([f"  ... and {len(diff) - MAX_LISTED} more"]
                                                      if len(diff) > MAX_LISTED else [])
    correction = _correction_keys(config, diff)
    if correction:
        listed.append(f"  {correction[0]}")
    if force:
        return ["--force-resume: loading the checkpoint although it was written with another config:", *listed]
    fix = ("resume with the run's own config (`--resume RUN_DIR` alone), start a new run, or pass --force-resume "
           "to load its weights anyway")
    if correction and all(d.startswith("algorithm.ratio.") for d in diff):
        fix = correction[1]
    elif correction:
        fix = f"{fix}; for algorithm.ratio: {correction[1]}"
    raise ResumeError(where, "the checkpoint was written with another algorithm, reward, model or data config "
                      "than the one given; these keys differ (checkpoint -> now):\n" + "\n".join(listed), fix)


def optimizer_notes(old_train: dict, config) -> list[str]:
    """Lines saying which optimizer settings changed since the checkpoint (they are applied)."""
    new = {"lr": config.train.lr, "weight_decay": config.train.weight_decay}
    changed = [f"train.{k} {old_train[k]:g} -> {v:g}" for k, v in new.items() if k in old_train
               and float(old_train[k]) != float(v)]
    if not changed:
        return []
    return [f"resume: {', '.join(changed)} since the checkpoint: the restored optimizer uses the new value "
            "(its Adam moments are kept)"]


def lr_plan(config) -> dict:
    """The schedule of a new run: ``train.steps x train.updates_per_batch`` optimizer steps, the
    warm-up ``train.warmup_steps`` or ``ceil(train.warmup_ratio x total)``."""
    t = config.train
    total = t.steps * t.updates_per_batch
    return vars(LRSchedule(t.lr_scheduler_type, t.warmup_steps or math.ceil(t.warmup_ratio * total), total))


def resume_schedule(state: dict, config) -> tuple[dict, list[str]]:
    """The schedule a resumed run goes on with, and lines for the console. The checkpoint's is kept
    when its type and horizon are the configured ones; else (another ``train.steps``,
    ``updates_per_batch`` or ``lr_scheduler_type``) it is re-planned from the optimizer step it
    reached (:meth:`LRSchedule.replanned`). Checkpoints without a schedule get the new run's plan."""
    new, old = lr_plan(config), dict(state.get("schedule") or {})
    done = int(old.pop("done", state["step"] * config.train.updates_per_batch))
    if not old:
        plan, lines = new, [f"the checkpoint records no learning-rate schedule: planned on {new['total_steps']} "
                            "optimizer steps from step 0, as a new run's"]
    elif (old["name"], old["total_steps"]) == (new["name"], new["total_steps"]):
        plan, lines = old, []
    else:
        plan = vars(LRSchedule(**old).replanned(done, new["name"], new["total_steps"]))
        lines = [f"learning-rate schedule: the checkpoint's {old['name']} ends at optimizer step "
                 f"{old['total_steps']}, the config's {new['name']} at {new['total_steps']}; re-planned from "
                 f"step {done} (factor {LRSchedule(**old)(done):.4g}) to end at {new['total_steps']}"]
    lr = config.train.lr * LRSchedule(**plan)(done)
    return plan, lines + [f"learning rate of the next update (optimizer step {done + 1}): {lr:.4g}"]
