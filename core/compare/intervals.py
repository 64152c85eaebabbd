"""The interval of ``policyzoo compare``: a 95% Student t-interval over seeds.

For ``n`` per-seed values ``x_1 .. x_n`` (one number per run: a held-out accuracy, a mean over the
last steps, ...) the summary is the mean ``m = sum(x) / n``, the sample standard deviation
``s = sqrt(sum((x - m)^2) / (n - 1))`` and the half-width ``h = t_{0.975, n-1} * s / sqrt(n)``; the
interval is ``m +- h``. A paired difference is the same summary of ``d_i = a_i - b_i`` over the seeds
both algorithms ran. With ``n = 1`` there is no ``s`` and no interval (``half_width`` is None).

Why a t-interval: each seed is one independent replicate of the whole run, and a comparison has few
of them (3 is typical); the per-seed values are means over many tokens and held-out rows, so close
to normal, and the t quantile (not 1.96) pays for estimating ``s`` from so few seeds.

``T975[df]`` is ``t_{0.975, df}`` for ``df = 1 .. 30``, to 9 decimals (the values of
``scipy.stats.t.ppf(0.975, df)``, as printed in the NIST/SEMATECH e-Handbook of Statistical Methods,
table 1.3.6.7.2; ``tests/test_compare_stats.py`` checks each by integrating the t density). Above 30
the Cornish-Fisher expansion of Abramowitz & Stegun 26.7.5 (three terms; error < 1e-5 there).
"""

from __future__ import annotations

import math

T975 = {1: 12.706204736, 2: 4.302652730, 3: 3.182446305, 4: 2.776445105, 5: 2.570581836, 6: 2.446911851,
        7: 2.364624252, 8: 2.306004135, 9: 2.262157163, 10: 2.228138852, 11: 2.200985160, 12: 2.178812830,
        13: 2.160368656, 14: 2.144786688, 15: 2.131449546, 16: 2.119905299, 17: 2.109815578, 18: 2.100922040,
        19: 2.093024054, 20: 2.085963447, 21: 2.079613845, 22: 2.073873068, 23: 2.068657610, 24: 2.063898562,
        25: 2.059538553, 26: 2.055529439, 27: 2.051830516, 28: 2.048407142, 29: 2.045229642, 30: 2.042272456}
Z975 = 1.959963984540054  # the standard normal's 0.975 quantile
INTERVAL = "95% t-interval over seeds: mean +- t(0.975, n-1) * s / sqrt(n), s the sample standard deviation"


def t975(df: int) -> float:
    """``t_{0.975, df}``, the two-sided 95% Student t quantile; ``df >= 1`` (ValueError otherwise)."""
    if df < 1:
        raise ValueError(f"the t quantile needs df >= 1, got {df}")
    if df in T975:
        return T975[df]
    z = Z975
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    return z + g1 / df + g2 / df**2 + g3 / df**3


def summary(values) -> dict | None:
    """``{n, mean, std, half_width, low, high, values}`` of the non-None ``values`` (``std``,
    ``half_width``, ``low``, ``high`` None when n = 1); None when no value is given."""
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not xs:
        return None
    n = len(xs)
    mean = sum(xs) / n
    if n == 1:
        return {"n": 1, "mean": mean, "std": None, "half_width": None, "low": None, "high": None, "values": xs}
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t975(n - 1) * std / math.sqrt(n)
    return {"n": n, "mean": mean, "std": std, "half_width": half, "low": mean - half, "high": mean + half,
            "values": xs}


def paired(a: dict, b: dict) -> dict | None:
    """The summary of ``a[k] - b[k]`` over the keys (seeds) both hold with values, plus ``pairs``
    (those keys, sorted); None when no key is shared."""
    keys = sorted(k for k in a if k in b and a[k] is not None and b[k] is not None)
    out = summary([a[k] - b[k] for k in keys])
    if out is not None:
        out["pairs"] = keys
    return out


def last_window(steps: int) -> int:
    """How many of the last training steps the end-of-run means use: ``ceil(steps / 5)`` (20%,
    rounded up, in integers), at least 1 (0 for a run without steps)."""
    return max(1, -(-steps // 5)) if steps > 0 else 0
