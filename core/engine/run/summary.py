"""A finished (or stopped) run's ``summary.json`` and its last console line."""

from __future__ import annotations

import math
from pathlib import Path

from policyzoo.engine.report.progress import EVAL_DEFINITION

from .startup import peak_rss_gib

_EVAL_K = ("eval_pass@", "eval_maj@", "eval_mean@")


def unscorable(records: list[dict]) -> tuple[int, dict[str, int]]:
    """Rows whose reward was NaN (unscorable: no advantage, no share of a baseline) over the training
    records of ``metrics.jsonl``: the total of their ``unscorable_rows`` and, per reward component
    label, of ``unscorable/<label>`` (rows where that component gave NaN; with several components
    and ``train.reward_nan: nansum`` a row is unscorable only when all of them are NaN)."""
    total, by = 0, {}
    for r in records:
        if r.get("kind") != "train":
            continue
        total += int(r.get("unscorable_rows") or 0)
        for k, v in r.items():
            if k.startswith("unscorable/") and v:
                label = k.removeprefix("unscorable/")
                by[label] = by.get(label, 0) + int(v)
    return total, by


def run_summary(part, loop, after: dict, stop=None) -> dict:
    """The summary of the run ``part`` (a :class:`~policyzoo.engine.run.session.RunPart`) run by ``loop``, with
    ``after`` the last evaluation record (``{}``: none): held-out accuracy before (``loop.eval_before``, else
    ``loop.first_eval()``) and after, steps, tokens, start-up seconds, memory (GiB), the warnings given, the run
    directory, whether the run stopped by itself (``stop``, a :class:`~policyzoo.engine.run.stop.RunStopped`:
    ``stopped_early``, ``stop_reason``, ``stop_cause``; False / None when it ran its steps) and its unscorable rows
    (:func:`unscorable`, over every step in ``metrics.jsonl``, resumed runs' earlier steps included)."""
    s, trainer, before = part, part.trainer, loop.eval_before
    rows, by_reward = unscorable(s.rundir.read_metrics())
    return {"steps": loop.state["step"], "algorithm": s.run.bundle.name, "model": str(s.model.path),
            "stopped_early": stop is not None, "stop_reason": None if stop is None else stop.reason,
            "stop_cause": None if stop is None else stop.cause,
            "unscorable_rows": rows, "unscorable_by_reward": by_reward,
            "eval_accuracy_before": before.get("eval_accuracy", loop.first_eval()),
            "eval_accuracy_after": after.get("eval_accuracy"),
            "eval_after": {k[5:]: v for k, v in after.items() if k.startswith(_EVAL_K)},
            "startup_seconds": s.startup.seconds,
            "startup_parts": s.startup.parts, "process_to_ready_seconds": s.startup.process_to_ready_s,
            "preload_seconds": s.startup.preload_s,
            "prompt_counts": s.prompt_counts,
            "tokens_seen": loop.state["tokens_seen"],
            "models_loaded": trainer.models_loaded(), "trainable_params": trainer.trainable_params,
            "peak_rss_gib": peak_rss_gib(), "zero_stage": trainer.stage,
            "rollout": s.config.engine.rollout, "share_prompt": trainer.share_prompt,
            "share_prompt_check": trainer.share_prompt_check, "run_dir": str(s.rundir.path),
            "warnings": list(s.warnings.given),
            "eval_metric": loop.eval_name(), "eval_metric_definition": EVAL_DEFINITION,
            **{k: v for k, v in after.items() if k.startswith("eval_accuracy/")},  # per task (_task rows)
            **{k.replace("eval_accuracy/", "eval_accuracy_before/"): v for k, v in before.items()
               if k.startswith("eval_accuracy/")}}


def print_done(console, summary: dict, eval_name: str, final: Path | None) -> None:
    """``done: held-out accuracy 0.25 -> 0.50; export in RUN_DIR/final`` (``n/a`` for a missing value;
    ``final`` None: no export, train.export_final is false)."""
    acc = [summary["eval_accuracy_before"], summary["eval_accuracy_after"]]
    acc = [f"{a:.2f}" if isinstance(a, float) and math.isfinite(a) else "n/a" for a in acc]
    where = f"export in {final}" if final is not None else "no export (train.export_final: false)"
    console.print(f"done: held-out {eval_name.removeprefix('held-out ')} {acc[0]} -> {acc[1]}; {where}")
