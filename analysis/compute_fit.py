"""The compute-fit speedup (``python -m report``'s effective speedup, Marin's optimizer study):
from laws of loss against compute fitted per optimizer, how much more compute the baseline
needs to reach another optimizer's fitted loss.

Per optimizer the fit through its points (C, L) is

    L(C) = L_inf + A * C^(-alpha)

(least squares in L: a grid over L_inf below the lowest loss, refined twice, and for each L_inf
the line log(L - L_inf) = log A - alpha log C by least squares; ``fit_power_law``). Three points
determine the three numbers exactly: the fit then interpolates, and the interval is the only
measure of its uncertainty. The speedup of X over the baseline at compute C is
C_base(L_X(C)) / C, with C_base(L) = (A_base / (L - L_inf_base))^(1/alpha_base), infinite when
L <= L_inf_base. Its interval: the fits redone on bootstrap resamples of each point's seeds
(``bootstrap_laws``), the central ``LEVEL`` percentiles (``compute_fit_speedup``). The other
speedups: analysis/speedup.py (data-equivalent) and analysis/time_to_loss.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from analysis.stats import LEVEL, percentile_interval

GRID = 200  # L_inf candidates per pass
MIN_POINTS = 3  # distinct compute values a fit needs (three unknowns)


@dataclass(frozen=True)
class PowerLaw:
    """``L(C) = l_inf + a * C**-alpha``."""

    l_inf: float
    a: float
    alpha: float

    def loss(self, compute: float | np.ndarray) -> float | np.ndarray:
        return self.l_inf + self.a * np.power(compute, -self.alpha)

    def compute_for(self, loss: float) -> float:
        """The compute at which the law reaches ``loss`` (inf when it never does)."""
        if loss <= self.l_inf:
            return math.inf
        return (self.a / (loss - self.l_inf)) ** (1 / self.alpha)


def fit_power_law(compute: np.ndarray, loss: np.ndarray) -> PowerLaw | None:
    """The least-squares ``PowerLaw`` through the points; None when the loss does not fall with
    compute (alpha <= 0). Needs ``MIN_POINTS`` distinct compute values (ValueError otherwise)."""
    c, y = np.asarray(compute, dtype=float), np.asarray(loss, dtype=float)
    if len(np.unique(c)) < MIN_POINTS or np.any(c <= 0):
        raise ValueError(
            f"a power-law fit needs {MIN_POINTS} or more distinct positive compute values, got "
            f"{sorted(set(c.tolist()))}; add runs at more model sizes or token counts"
        )
    x = np.log(c) - np.log(c).mean()  # centred: a well-conditioned line
    top = float(y.min())
    lows = top - top * np.geomspace(1.0, 1e-6, GRID)  # from 0 up to just below the lowest loss
    best = None
    for _ in range(3):  # a coarse pass, then two finer ones around the best candidate
        sse, slope, icept = _line_fits(x, y, lows)
        k = int(np.nanargmin(sse))
        best = (lows[k], slope[k], icept[k])
        lo, hi = lows[max(k - 1, 0)], lows[min(k + 1, len(lows) - 1)]
        lows = np.linspace(lo, hi, GRID)
    l_inf, slope, icept = best
    if not slope < 0:
        return None
    alpha = -float(slope)
    a = math.exp(float(icept) + alpha * float(np.log(c).mean()))  # undo the centring
    return PowerLaw(float(l_inf), a, alpha)


def _line_fits(
    x: np.ndarray, y: np.ndarray, lows: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per candidate L_inf: the log-space line (slope, intercept) and its squared error in L."""
    ly = np.log(np.maximum(y[None, :] - lows[:, None], 1e-300))
    slope = ((ly - ly.mean(axis=1, keepdims=True)) * x).sum(axis=1) / (x * x).sum()
    icept = ly.mean(axis=1)
    pred = lows[:, None] + np.exp(icept[:, None] + slope[:, None] * x[None, :])
    return ((pred - y[None, :]) ** 2).sum(axis=1), slope, icept


def speedup_at(law: PowerLaw, base: PowerLaw, compute: float) -> float:
    """C_base(L_X(C)) / C: the baseline's compute to reach X's loss at C, over C."""
    return base.compute_for(float(law.loss(compute))) / compute


def bootstrap_laws(
    computes: list[float], bests: list[list[float]], rng: np.random.Generator, resamples: int
) -> list[PowerLaw | None]:
    """The fit redone on ``resamples`` resamples of each point's seeds (``bests``: per point,
    each seed's loss; the mean of a resample is the point's loss)."""
    c = np.array(computes)
    laws = []
    for _ in range(resamples):
        means = [float(np.mean(rng.choice(b, len(b)))) for b in bests]
        laws.append(fit_power_law(c, np.array(means)))
    return laws


def compute_fit_speedup(
    law: PowerLaw,
    base: PowerLaw,
    compute: float,
    boot: tuple[list[PowerLaw | None], list[PowerLaw | None]] | None,
) -> dict[str, Any]:
    """The compute-fit speedup at ``compute`` with its interval from the paired bootstrap fits
    ``boot`` (X's, the baseline's; None: no interval, one seed per point): ``ratio``, ``lo``,
    ``hi``, ``within_noise``, ``failed_fits`` (resamples whose fit does not fall with compute,
    dropped). Percentiles without interpolation, so that infinite speedups are allowed."""
    row = {
        "ratio": speedup_at(law, base, compute),
        "lo": None,
        "hi": None,
        "within_noise": None,
        "failed_fits": 0,
    }
    if boot is not None:
        ratios = [speedup_at(x, b, compute) for x, b in zip(*boot) if x and b]
        row["failed_fits"] = len(boot[0]) - len(ratios)
        if ratios:
            row["lo"], row["hi"] = percentile_interval(ratios, LEVEL, method="inverted_cdf")
            row["within_noise"] = row["lo"] <= 1.0 <= row["hi"]
    return row
