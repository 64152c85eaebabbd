"""``policyzoo plot RUN_DIR``: the six curves of a run (from ``metrics.jsonl``) in one PNG.

Panels: reward mean (with the held-out accuracy of eval records as points, and per task for rows
that name one: ``eval_accuracy/<task>``), KL to the reference,
response length (mean and max), clip fraction (low and high), entropy, fraction of zero-std
groups. A metric a run does not have (e.g. KL without a ``kl`` component) is drawn as an empty
panel that says so. A run with an environment gets a third row: the fraction of episodes that
called a tool (training samples, and the greedy held-out episodes as points), turns and tool
errors per episode, and the fraction of episodes truncated by the turn or the token budget.
"""

from __future__ import annotations

from pathlib import Path

from policyzoo.engine.rundir import RunDir
from policyzoo.errors import UserError

PANELS = [
    ("reward", [("reward_mean", "reward mean")]),
    ("KL to reference", [("kl_ref", "kl_ref")]),
    ("response length (tokens)", [("response_length_mean", "mean"), ("response_length_max", "max")]),
    ("clip fraction", [("clip_frac_low", "low"), ("clip_frac_high", "high")]),
    ("entropy (nats/token)", [("entropy", "entropy")]),
    ("zero-std groups", [("zero_std_frac", "fraction")]),
]
ENV_PANELS = [
    ("episodes calling a tool", [("env_tool_call_frac", "training samples")]),
    ("per episode", [("env_turns_mean", "turns"), ("env_tool_errors_mean", "tool errors")]),
    ("truncated episodes", [("env_truncated_turns_frac", "turn budget"),
                            ("env_truncated_tokens_frac", "token budget")]),
]
#: panel title -> (eval record key, label) drawn as points over the training curve
EVAL_POINTS = {"reward": ("eval_accuracy", "held-out accuracy (greedy)"),
               "episodes calling a tool": ("eval_env_tool_call_frac", "held-out (greedy)")}


def main(run_dir: str, output: str | None = None) -> Path:
    """Draw the curves; returns the PNG path (default ``RUN_DIR/curves.png``).
    Raises :class:`UserError` when the folder has no metrics."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not Path(run_dir).is_dir():
        raise UserError(str(run_dir), "no such folder" if not Path(run_dir).exists() else "not a folder",
                        "pass a run directory written by `policyzoo train` (its --output-dir)")
    rd = RunDir(run_dir)
    records = rd.read_metrics()
    train = [r for r in records if r.get("kind", "train") == "train"]
    if not train:
        raise UserError(str(run_dir), "no training steps in metrics.jsonl (or no metrics.jsonl)",
                        "pass a run directory written by `policyzoo train`")
    evals = [r for r in records if r.get("kind") == "eval"]
    panels = PANELS + (ENV_PANELS if any("env_turns_mean" in r for r in train) else [])
    fig, axes = plt.subplots(len(panels) // 3, 3, figsize=(13, 3.5 * (len(panels) // 3)), constrained_layout=True)
    for ax, (title, series) in zip(axes.flat, panels):
        drawn = False
        for key, label in series:
            pts = [(r["step"], r[key]) for r in train if r.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=3, label=label)
                drawn = True
        key, label = EVAL_POINTS.get(title, (None, None))
        points = [(r["step"], r[key]) for r in evals if r.get(key) is not None]
        if points:
            ax.plot(*zip(*points), "s--", color="tab:red", label=label)
            drawn = True
        for k in sorted({k for r in evals for k in r if k.startswith("eval_accuracy/")}) if title == "reward" else ():
            task_points = [(r["step"], r[k]) for r in evals if r.get(k) is not None]  # per task of a mixture
            ax.plot(*zip(*task_points), "^:", ms=4, label=f"held-out {k.split('/', 1)[1]}")
            drawn, points = True, points or task_points
        if not drawn:
            ax.text(0.5, 0.5, "not in this run", ha="center", va="center", transform=ax.transAxes, color="gray")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if drawn and (len(series) > 1 or points):
            ax.legend(fontsize=8)
    fig.suptitle(f"policyzoo run: {Path(run_dir).name}")
    out = Path(output) if output else rd.path / "curves.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    print(out)
    return out
