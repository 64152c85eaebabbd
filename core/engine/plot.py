"""``policyzoo plot RUN_DIR``: the six curves of a run (from ``metrics.jsonl``) in one PNG.

Panels: reward mean (with the held-out accuracy of eval records as points), KL to the reference,
response length (mean and max), clip fraction (low and high), entropy, fraction of zero-std
groups. A metric a run does not have (e.g. KL without a ``kl`` component) is drawn as an empty
panel that says so.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from .rundir import RunDir

PANELS = [
    ("reward", [("reward_mean", "reward mean")]),
    ("KL to reference", [("kl_ref", "kl_ref")]),
    ("response length (tokens)", [("response_length_mean", "mean"), ("response_length_max", "max")]),
    ("clip fraction", [("clip_frac_low", "low"), ("clip_frac_high", "high")]),
    ("entropy (nats/token)", [("entropy", "entropy")]),
    ("zero-std groups", [("zero_std_frac", "fraction")]),
]


def main(run_dir: str, output: str | None = None) -> Path:
    """Draw the curves; returns the PNG path (default ``RUN_DIR/curves.png``).
    Raises :class:`UserError` when the folder has no metrics."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rd = RunDir(run_dir)
    records = rd.read_metrics()
    train = [r for r in records if r.get("kind", "train") == "train"]
    if not train:
        raise UserError(str(run_dir), "no training steps in metrics.jsonl (or no metrics.jsonl)",
                        "pass a run directory written by `policyzoo train`")
    evals = [r for r in records if r.get("kind") == "eval" and r.get("eval_accuracy") is not None]
    fig, axes = plt.subplots(2, 3, figsize=(13, 7), constrained_layout=True)
    for ax, (title, series) in zip(axes.flat, PANELS):
        drawn = False
        for key, label in series:
            pts = [(r["step"], r[key]) for r in train if r.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=3, label=label)
                drawn = True
        if title == "reward" and evals:
            ax.plot([r["step"] for r in evals], [r["eval_accuracy"] for r in evals], "s--", color="tab:red",
                    label="held-out accuracy (greedy)")
            drawn = True
        if not drawn:
            ax.text(0.5, 0.5, "not in this run", ha="center", va="center", transform=ax.transAxes, color="gray")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(series) > 1 or (title == "reward" and evals):
            ax.legend(fontsize=8)
    fig.suptitle(f"policyzoo run: {Path(run_dir).name}")
    out = Path(output) if output else rd.path / "curves.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    print(out)
    return out
