"""The time-to-loss speedup (``python -m report``'s): the baseline's tokens (or wall-clock
seconds) to first reach its best validation loss L*, over another optimizer's.

The target L* is the minimum of the baseline's seed-mean curve (with a decaying schedule, its
final loss). Between two evaluations the loss is interpolated linearly in log x (log tokens, log
seconds), closer to a loss curve's shape than linear in x; from x = 0 (the step-0 evaluation)
linearly. An optimizer that never gets down to L* within its run is "not reached": its speedup
is below the baseline's x over its whole run's x.

Interval: ``resamples`` bootstrap resamples (numpy ``default_rng(seed)``, so a report is
reproducible): each side's seeds resampled with replacement, L* and the speedup recomputed; the
central ``LEVEL`` percentiles. A resample that does not reach L* counts as the lowest speedup.
The speedup is within noise when the interval contains 1.0x. With one seed on either side there
is no interval. The other speedups: analysis/speedup.py (data-equivalent, the study's) and
analysis/compute_fit.py (from fitted laws).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from analysis.stats import LEVEL, REPORT_RESAMPLES, percentile_interval

Curves = tuple[np.ndarray, np.ndarray]  # (grid x, per-seed losses: seeds x grid)


def reach(x: np.ndarray, y: np.ndarray, target: float) -> float | None:
    """The first x where the curve gets down to ``target``: log-linear in x between evaluations
    (linear from x = 0); None when it never does."""
    hits = np.nonzero(y <= target + 1e-12)[0]
    if not len(hits):
        return None
    i = int(hits[0])
    if i == 0:
        return float(x[0])
    x0, x1, y0, y1 = float(x[i - 1]), float(x[i]), float(y[i - 1]), float(y[i])
    frac = (y0 - target) / (y0 - y1)
    if x0 > 0:
        return float(math.exp(math.log(x0) + frac * (math.log(x1) - math.log(x0))))
    return x0 + frac * (x1 - x0)


def ratio_of(base: Curves, other: Curves, base_idx: np.ndarray, other_idx: np.ndarray) -> float:
    """The speedup for one choice of seeds (indices into the seed rows); 0.0 when not reached."""
    base_mean = base[1][base_idx].mean(axis=0)
    i = int(np.argmin(base_mean))
    t = reach(other[0], other[1][other_idx].mean(axis=0), float(base_mean[i]))
    return float(base[0][i]) / t if t else 0.0 if t is None else math.inf


def x_of_best(curves: Curves) -> float:
    """Where the seed-mean curve is lowest (first reaches its minimum)."""
    return float(curves[0][int(np.argmin(curves[1].mean(axis=0)))])


def time_to_loss_speedup(
    base: Curves | None, other: Curves | None, *, resamples: int = REPORT_RESAMPLES, seed: int = 0
) -> dict[str, Any] | None:
    """One speedup with its interval (module docstring); None when a curve is missing.

    ``x``: the optimizer's x to reach L*; ``bound``: when not reached, the baseline's x over the
    optimizer's last x (the speedup is below it); ``lo``/``hi``: the interval (None without one;
    ``lo`` None with ``censored`` when more than 5% of resamples do not reach L*).
    """
    if base is None or other is None:
        return None
    nb, no = len(base[1]), len(other[1])
    base_mean, other_mean = base[1].mean(axis=0), other[1].mean(axis=0)
    i = int(np.argmin(base_mean))
    x_base = float(base[0][i])
    # no evaluation after step 0 yet (the baseline's or this run's): no speedup to give
    in_progress = x_base <= 0 or float(other[0][-1]) <= 0
    t = None if in_progress else reach(other[0], other_mean, float(base_mean[i]))
    cell: dict[str, Any] = {
        "x": t,
        "x_base": x_base,
        "in_progress": in_progress,
        "best": float(other_mean.min()),  # this axis's own seed-mean curve (time: its seeds)
        "target": float(base_mean[i]),
        "ratio": None if t is None else (x_base / t if t > 0 else math.inf),
        "bound": x_base / float(other[0][-1]) if t is None and not in_progress else None,
        "n_seeds": min(nb, no),
        "interval": nb > 1 and no > 1,
        "lo": None,
        "hi": None,
        "censored": False,
        "reached_fraction": None,
        "within_noise": None,
    }
    if not cell["interval"] or in_progress:
        cell["interval"] = cell["interval"] and not in_progress
        return cell
    rng = np.random.default_rng(seed)
    ratios = np.array(
        [
            ratio_of(base, other, rng.integers(0, nb, nb), rng.integers(0, no, no))
            for _ in range(resamples)
        ]
    )
    lo, hi = percentile_interval(ratios, LEVEL)
    cell.update(
        lo=lo if lo > 0 else None,
        hi=hi if hi > 0 else None,
        censored=bool(lo <= 0),
        reached_fraction=float(np.mean(ratios > 0)),
        within_noise=bool(lo <= 1.0 <= hi),
    )
    return cell
