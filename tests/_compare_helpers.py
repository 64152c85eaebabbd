"""A finished `policyzoo train` run directory written by hand (config.yaml, summary.json, metrics.jsonl
in the engine's format), for the compare tests."""

from __future__ import annotations

import json
from pathlib import Path

import yaml


def write_run(path: Path, algorithm, seed: int, after: float, before: float = 0.1, steps: int = 6,
              reward_offset: float = 0.0, kl: bool = True, config: dict | None = None, **config_changes) -> Path:
    """A finished run of ``steps`` steps; ``config`` is its config.yaml (e.g. a planned run's; default: a small
    one). Per step k (1-based): reward_mean = k/10 + offset, kl_ref = k/100, entropy 1.0 (k <= 4) then 2.0,
    3.0; clip_frac_low 0.1, clip_frac_high 0.02 k; response_length_mean 10 k; time_step 5, 1, 2, 3, 4, 85
    (sum 100); 100 rollout + 50 prompt tokens; peak_rss_gib 1 + k/10."""
    path.mkdir(parents=True)
    config = config or {"algorithm": algorithm, "model": {"path": "m"}, "data": {"name": "arithmetic", "seed": seed},
                        "train": {"steps": steps, "seed": seed, "lr": 1e-3}, "engine": {"threads": None},
                        "output_dir": str(path)}
    for key, value in config_changes.items():
        section, leaf = key.split("__")
        config[section][leaf] = value
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    times = [5.0, 1.0, 2.0, 3.0, 4.0, 85.0][:steps] + [1.0] * max(0, steps - 6)
    entropy = [1.0, 1.0, 1.0, 1.0, 2.0, 3.0][:steps] + [1.0] * max(0, steps - 6)
    lines = [{"kind": "eval", "step": 0, "eval_accuracy": before, "time_eval": 2.0}]
    for k in range(1, steps + 1):
        rec = {"kind": "train", "step": k, "reward_mean": k / 10 + reward_offset, "entropy": entropy[k - 1],
               "clip_frac_low": 0.1, "clip_frac_high": 0.02 * k, "response_length_mean": 10.0 * k,
               "time_step": times[k - 1], "rollout_tokens": 100, "prompt_tokens": 50, "peak_rss_gib": 1 + k / 10}
        if kl:
            rec["kl_ref"] = k / 100
        lines.append(rec)
    lines.append({"kind": "eval", "step": steps, "eval_accuracy": after, "time_eval": 2.0})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    summary = {"steps": steps, "eval_accuracy_before": before, "eval_accuracy_after": after, "peak_rss_gib": 2.5,
               "eval_metric": "accuracy", "algorithm": "x"}
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def write_planned(spec, after: float = 0.1, steps: int | None = None) -> Path:
    """The finished run of a planned :class:`RunSpec` (its planned config.yaml), of ``steps`` (default: its own)."""
    return write_run(spec.path, spec.base, spec.seed, after, steps=spec.steps if steps is None else steps,
                     config=spec.config)
