"""The study's statistics (docs/study.md): paired differences over seeds with t-intervals, an
optional bootstrap over pairs, and data-equivalent speedups read off AdamW's end-of-run losses
across its budgets, censored outside the measured budgets.

A seed fixes the initial weights and the data order of every optimizer alike, so two optimizers'
runs of one seed are a pair: the interval is that of the mean per-seed difference (Student's t
with n - 1 degrees of freedom), not of two independent means. Plain Python and numpy: the t
quantile comes from the regularised incomplete beta function (Numerical Recipes' continued
fraction), so the study needs no scipy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

LEVEL = 0.90  # two-sided level of every interval the study and the report print
RESAMPLES = 2000  # the study's bootstraps (``bootstrap_pairs``, ``data_equivalent_speedup``)
# ``python -m report``'s bootstraps (the time-to-loss and compute-fit speedups) keep the 1,000
# resamples the committed reports were made with (results/llama-cpu/, results/scaling-cpu/):
# 2,000 would move the last digits of their intervals.
REPORT_RESAMPLES = 1000


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (Lentz's method)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                    -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):  # fmt: skip
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    ln = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x)
    front = math.exp(ln + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (bisection on ``t_cdf``; 1e-10 accurate)."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    lo, hi = -1e3, 1e3
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class Interval:
    mean: float
    lo: float
    hi: float
    n: int

    @property
    def significant(self) -> bool:
        """The interval excludes 0 (a difference the seeds can tell from none)."""
        return self.n > 1 and (self.lo > 0 or self.hi < 0)


def mean_interval(values, level: float = LEVEL) -> Interval:  # noqa: ANN001 - numbers
    """The mean of ``values`` with its Student-t interval (none, lo = hi = mean, for n = 1)."""
    x = np.asarray(values, dtype=float)
    n, m = len(x), float(np.mean(x))
    if n < 2:
        return Interval(m, m, m, n)
    half = t_quantile(0.5 + level / 2, n - 1) * float(np.std(x, ddof=1)) / math.sqrt(n)
    return Interval(m, m - half, m + half, n)


def paired_interval(base: dict, other: dict, level: float = LEVEL) -> Interval:
    """``other - base`` over the seeds both have (``{seed: loss}``): the mean per-seed
    difference and its t-interval."""
    seeds = sorted(set(base) & set(other))
    if not seeds:
        raise ValueError(
            "no seed in common: a paired difference needs the same seeds on both sides"
        )
    return mean_interval([other[s] - base[s] for s in seeds], level)


def unpaired_interval(base, other, level: float = LEVEL) -> Interval:  # noqa: ANN001
    """Welch's interval of ``mean(other) - mean(base)``: what ignoring the pairing would give."""
    a, b = np.asarray(base, dtype=float), np.asarray(other, dtype=float)
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = t_quantile(0.5 + level / 2, df) * math.sqrt(va + vb)
    m = float(b.mean() - a.mean())
    return Interval(m, m - half, m + half, min(len(a), len(b)))


def percentile_interval(
    values, level: float = LEVEL, *, method: str = "linear"
) -> tuple[float, float]:  # noqa: ANN001
    """The central ``level`` interval of ``values`` (a bootstrap's statistics): their
    ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles (``method``: numpy's; ``inverted_cdf``
    takes no mean of two values, so infinite ones are allowed)."""
    lo, hi = np.quantile(np.asarray(values, dtype=float), [0.5 - level / 2, 0.5 + level / 2],
                         method=method)  # fmt: skip
    return float(lo), float(hi)


def bootstrap_pairs(diffs, level: float = LEVEL, resamples: int = RESAMPLES, seed: int = 0):  # noqa: ANN001, ANN201
    """A percentile bootstrap of the mean over the pairs' differences (the pairs resampled
    whole, with numpy's ``default_rng(seed)``)."""
    d = np.asarray(diffs, dtype=float)
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), size=(resamples, len(d)))].mean(axis=1)
    lo, hi = percentile_interval(means, level)
    return Interval(float(d.mean()), lo, hi, len(d))


def paired_p_value(base: dict, other: dict) -> float:
    """The two-sided p-value of the paired t-test of ``other - base`` over their shared seeds
    (1.0 with fewer than two pairs or no spread)."""
    seeds = sorted(set(base) & set(other))
    d = np.asarray([other[s] - base[s] for s in seeds], dtype=float)
    if len(d) < 2 or not np.all(np.isfinite(d)):
        return 1.0
    sd = float(np.std(d, ddof=1))
    if sd == 0.0:
        return 0.0 if float(d.mean()) != 0.0 else 1.0
    t = float(d.mean()) / (sd / math.sqrt(len(d)))
    return min(1.0, 2.0 * (1.0 - t_cdf(abs(t), len(d) - 1)))


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment of ``p_values`` (same order): a hypothesis is rejected at
    family-wise level alpha when its adjusted p is at most alpha."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
