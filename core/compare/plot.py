"""``compare.png``: the algorithms' curves, one colour per algorithm, the mean over seeds as a line and
the 95% t-interval over seeds as a band (no band where fewer than 2 seeds have the step), the band cut
to the metric's range (:data:`RANGES`: a t-interval of a few seeds can reach past what the metric can
take, e.g. below 0 for an accuracy of 0.1 +- 0.3).

Top row: training reward and the held-out metric against the step and against the clock (seconds of
training steps and evaluations, the mean over seeds; start-up, checkpoints and export left out).
Middle row, small multiples against the step: KL to the reference, entropy, response length and clip
fraction. Bottom row, the mechanisms: zero-std group fraction, kept fraction, response length of right
(solid) and wrong (dashed) answers, response tokens sampled per kept row. A metric no run has (KL
without a ``kl`` component) leaves its panel saying so.
"""

from __future__ import annotations

from pathlib import Path

PANELS = [("reward (training)", "reward_mean", "step"), ("held-out: {metric}", "eval", "step"),
          ("reward (training)", "reward_mean", "seconds"), ("held-out: {metric}", "eval", "seconds"),
          ("KL to reference", "kl_ref", "step"), ("entropy (nats/token)", "entropy", "step"),
          ("response length (tokens)", "response_length_mean", "step"), ("clip fraction", "clip_frac", "step"),
          ("zero-std group fraction", "zero_std_frac", "step"), ("kept fraction (kept / sampled rows)", "kept_frac",
                                                                 "step"),
          ("length of right (solid) / wrong (dashed) answers", "response_length_correct_mean", "step"),
          ("response tokens sampled per kept row", "tokens_per_kept_row", "step")]
#: a second curve drawn dashed in the panel of the first
DASHED = {"response_length_correct_mean": "response_length_wrong_mean"}
UNIT = (0.0, 1.0)
NON_NEGATIVE = (0.0, None)
#: each curve's range (low, high; None: unbounded): the bands are cut to it. ``eval`` is [0, 1] when the
#: held-out metric is an accuracy, unbounded for a held-out reward; the training reward is unbounded
RANGES = {"kl_ref": NON_NEGATIVE, "entropy": NON_NEGATIVE, "response_length_mean": NON_NEGATIVE,
          "response_length_correct_mean": NON_NEGATIVE, "response_length_wrong_mean": NON_NEGATIVE,
          "tokens_per_kept_row": NON_NEGATIVE, "clip_frac": UNIT, "zero_std_frac": UNIT, "kept_frac": UNIT}


def value_range(key: str, metric: str) -> tuple[float | None, float | None]:
    """The range of curve ``key`` (:data:`RANGES`; ``eval``: [0, 1] for ``accuracy``)."""
    if key == "eval":
        return UNIT if metric == "accuracy" else (None, None)
    return RANGES.get(key, (None, None))


def band_limits(ys: list[float], hw: list[float | None], low: float | None, high: float | None) -> list[tuple]:
    """``(index, lower, upper)`` of the band at each point with a half-width: ``y -+ h`` cut to
    ``[low, high]`` (None: no bound on that side)."""
    out = []
    for i, (y, h) in enumerate(zip(ys, hw)):
        if h is None:
            continue
        lo, hi = y - h, y + h
        out.append((i, lo if low is None else max(lo, low), hi if high is None else min(hi, high)))
    return out


def _xy(curves: dict, key: str, axis: str) -> tuple[list, list, list]:
    band = curves[key]
    xs = band["step"]
    if axis == "seconds":
        clock = curves["eval_seconds" if key == "eval" else "train_seconds"]
        at = dict(zip(clock["step"], clock["mean"]))
        keep = [i for i, s in enumerate(xs) if s in at]
        return [at[xs[i]] for i in keep], [band["mean"][i] for i in keep], [band["half_width"][i] for i in keep]
    return list(xs), list(band["mean"]), list(band["half_width"])


def _curve(ax, algo: dict, key: str, axis: str, colour, style: str, limits: tuple) -> bool:
    """One algorithm's line and clipped band for ``key``; False when it has no point."""
    if key not in algo["curves"]:
        return False
    xs, ys, hw = _xy(algo["curves"], key, axis)
    if not xs:
        return False
    ax.plot(xs, ys, style, marker="o" if len(xs) < 30 else None, ms=3, color=colour,
            label=f"{algo['algorithm']} (n={algo['n']})" if style == "-" else None)
    band = band_limits(ys, hw, *limits)
    if band:
        idx, lo, hi = zip(*band)
        ax.fill_between([xs[i] for i in idx], lo, hi, color=colour, alpha=0.2 if style == "-" else 0.1, linewidth=0)
    return True


def draw(result: dict, path: Path) -> Path:
    """Draw the panels of the module docstring for ``result`` (:func:`policyzoo.compare.aggregate.aggregate`)
    into ``path`` (PNG, 100 dpi); returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 4, figsize=(18, 12), constrained_layout=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (title, key, axis) in zip(axes.flat, PANELS):
        drawn = False
        for i, algo in enumerate(result["algorithms"]):
            for k, style in ((key, "-"), *(((DASHED[key], "--"),) if key in DASHED else ())):
                drawn = _curve(ax, algo, k, axis, colours[i % len(colours)], style,
                               value_range(k, result["metric"])) or drawn
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
