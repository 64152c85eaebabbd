"""``compare.png``: the algorithms' curves, one colour per algorithm, the mean over seeds as a line and
the 95% t-interval over seeds as a band (no band where fewer than 2 seeds have the step).

Top row: training reward and the held-out metric against the step and against the clock (seconds of
training steps and evaluations, the mean over seeds; start-up, checkpoints and export left out).
Bottom row, small multiples against the step: KL to the reference, entropy, response length and clip
fraction. A metric no run has (KL without a ``kl`` component) leaves its panel saying so.
"""

from __future__ import annotations

from pathlib import Path

PANELS = [("reward (training)", "reward_mean", "step"), ("held-out: {metric}", "eval", "step"),
          ("reward (training)", "reward_mean", "seconds"), ("held-out: {metric}", "eval", "seconds"),
          ("KL to reference", "kl_ref", "step"), ("entropy (nats/token)", "entropy", "step"),
          ("response length (tokens)", "response_length_mean", "step"), ("clip fraction", "clip_frac", "step")]


def _xy(curves: dict, key: str, axis: str) -> tuple[list, list, list]:
    band = curves[key]
    xs = band["step"]
    if axis == "seconds":
        clock = curves["eval_seconds" if key == "eval" else "train_seconds"]
        at = dict(zip(clock["step"], clock["mean"]))
        keep = [i for i, s in enumerate(xs) if s in at]
        return [at[xs[i]] for i in keep], [band["mean"][i] for i in keep], [band["half_width"][i] for i in keep]
    return list(xs), list(band["mean"]), list(band["half_width"])


def draw(result: dict, path: Path) -> Path:
    """Draw the panels of the module docstring for ``result`` (:func:`policyzoo.compare.aggregate.aggregate`)
    into ``path`` (PNG, 100 dpi); returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(18, 8), constrained_layout=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (title, key, axis) in zip(axes.flat, PANELS):
        drawn = False
        for i, algo in enumerate(result["algorithms"]):
            xs, ys, hw = _xy(algo["curves"], key, axis)
            if not xs:
                continue
            colour = colours[i % len(colours)]
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, ms=3, color=colour,
                    label=f"{algo['algorithm']} (n={algo['n']})")
            band = [(x, y - h, y + h) for x, y, h in zip(xs, ys, hw) if h is not None]
            if band:
                bx, lo, hi = zip(*band)
                ax.fill_between(bx, lo, hi, color=colour, alpha=0.2, linewidth=0)
            drawn = True
        if not drawn:
            ax.text(0.5, 0.5, "not in these runs", ha="center", va="center", transform=ax.transAxes, color="gray")
        ax.set_title(title.format(metric=result["metric"]))
        ax.set_xlabel("step" if axis == "step" else "seconds (steps + evaluations, mean over seeds)")
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=7)
    seeds = max(a["n"] for a in result["algorithms"])
    fig.suptitle(f"policyzoo compare: mean over seeds, band = 95% t-interval (up to {seeds} seed(s); baseline "
                 f"{result['baseline']})")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
