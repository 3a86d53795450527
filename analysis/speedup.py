"""The data-equivalent speedup (the study's): how much data AdamW needs to reach another
optimizer's end-of-run loss. The report's two others, each named by its estimator:
analysis/time_to_loss.py and analysis/compute_fit.py (docs/design.md, "speedup").

AdamW (the reference) is trained, each budget with its own full schedule, at several budgets D_k
(tokens); its mean end-of-run validation loss over the evaluation seeds at each is L_k. Loss can
only fall with more data, so a rise between budgets is seed noise: the L_k are made monotone
(non-increasing, pool-adjacent-violators), then log D is read off a monotone cubic through
the points (log D_k, L_k) (Fritsch-Carlson PCHIP, ``pchip``; a straight line between budgets
would overstate speedups by a few percent). An optimizer X trained on D tokens with mean loss L_X has speedup
``D_AdamW(L_X) / D``. Outside the measured budgets nothing is guessed: a loss below AdamW's at its
largest budget is censored (``>4.00x`` with 1x..4x budgets), one above its smallest budget too
(``<1.00x``); the bound is printed.

Interval: per seed, the speedup read off that seed's own AdamW curve (a seed fixes the weights
and the data order of every run, so each seed is one paired measurement, AdamW's noise at every
budget included); the t-interval of their logs, back-transformed. A seed beyond the measured
budgets censors that side of the interval at the bound. The point: with no seed censored, the
geometric mean of the per-seed readings (the interval's centre); with one censored, AdamW's
tokens at the optimizer's mean loss read off AdamW's mean curve. ``bootstrap=True`` instead resamples
the seeds whole (every budget and X together) and recomputes the speedup of the means.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from analysis.stats import LEVEL, RESAMPLES, mean_interval, percentile_interval


@dataclass(frozen=True)
class Speedup:
    value: float  # the speedup, or the censoring bound when ``side`` is set
    side: str = ""  # "": measured; ">": above the bound; "<": below it

    def __str__(self) -> str:
        return f"{self.side}{self.value:.2f}x"

    @property
    def censored(self) -> bool:
        return bool(self.side)


def isotonic_decreasing(y) -> np.ndarray:  # noqa: ANN001 - numbers
    """The non-increasing sequence closest to ``y`` in least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight]
    for v in np.asarray(y, dtype=float):
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            (m2, w2), (m1, w1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2])
    return np.concatenate([np.full(int(w), m) for m, w in blocks])


def pchip(x, y, at: float) -> float:  # noqa: ANN001 - ascending x
    """Monotone cubic (Fritsch-Carlson PCHIP) interpolation of (x, y) at ``at``: through every
    point, monotone between them, and with the curvature a loss-vs-log-data curve has, which a
    straight line between budgets lacks (it overstates speedups by a few percent)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) == 1:
        return float(y[0])
    h, delta = np.diff(x), np.diff(y) / np.diff(x)
    d = np.zeros_like(x)
    d[0], d[-1] = delta[0], delta[-1]
    for k in range(1, len(x) - 1):
        if delta[k - 1] * delta[k] > 0:
            w1, w2 = 2 * h[k] + h[k - 1], h[k] + 2 * h[k - 1]
            d[k] = (w1 + w2) / (w1 / delta[k - 1] + w2 / delta[k])
    if len(x) > 2:  # the ends: three-point estimates, kept monotone (Fritsch-Carlson)
        ends = ((0, h[0], h[1], delta[0], delta[1]), (-1, h[-1], h[-2], delta[-1], delta[-2]))
        for k, h0, h1, d0, d1 in ends:
            slope = ((2 * h0 + h1) * d0 - h0 * d1) / (h0 + h1)
            if np.sign(slope) != np.sign(d0):
                slope = 0.0
            elif np.sign(d0) != np.sign(d1) and abs(slope) > 3 * abs(d0):
                slope = 3 * d0
            d[k] = slope
    i = int(np.clip(np.searchsorted(x, at) - 1, 0, len(x) - 2))
    t = (at - x[i]) / h[i]
    h00, h10, h01, h11 = (
        2 * t**3 - 3 * t**2 + 1,
        t**3 - 2 * t**2 + t,
        -2 * t**3 + 3 * t**2,
        t**3 - t**2,
    )
    return float(h00 * y[i] + h10 * h[i] * d[i] + h01 * y[i + 1] + h11 * h[i] * d[i + 1])


def data_needed(loss: float, tokens, losses) -> tuple[float, str]:  # noqa: ANN001
    """(D, "") with AdamW's interpolated curve at ``loss`` = D tokens; (bound, ">" or "<") when
    ``loss`` lies beyond the measured budgets. ``tokens`` ascending, ``losses`` their means.
    log D is a monotone cubic in the loss through AdamW's (monotone) points; on a flat stretch the
    first budget that reaches it counts."""
    d = np.asarray(tokens, dtype=float)
    curve = isotonic_decreasing(losses)
    if loss < curve[-1]:
        return float(d[-1]), ">"
    if loss > curve[0]:
        return float(d[0]), "<"
    keep = [i for i in range(len(d)) if i == 0 or curve[i] < curve[i - 1]]  # first of a flat run
    x, y = curve[keep][::-1], np.log(d[keep])[::-1]  # ascending loss
    return float(math.exp(pchip(x, y, loss))), ""


def speedup_at(loss: float, budget_tokens: float, tokens, losses) -> Speedup:  # noqa: ANN001
    need, side = data_needed(loss, tokens, losses)
    return Speedup(need / budget_tokens, side)


@dataclass(frozen=True)
class SpeedupResult:
    point: Speedup
    lo: Speedup
    hi: Speedup


def _curve(adamw: dict, seeds: list) -> tuple[list, list]:
    budgets = sorted(adamw)
    return budgets, [float(np.mean([adamw[b][s] for s in seeds])) for b in budgets]


def data_equivalent_speedup(adamw: dict, other: dict, budget_tokens: float, *, level: float = LEVEL,
            bootstrap: bool = False, resamples: int = RESAMPLES, seed: int = 0) -> SpeedupResult:  # fmt: skip
    """``other``'s speedup over AdamW. ``adamw``: ``{tokens: {seed: loss}}`` over its budgets
    (``budget_tokens`` among them); ``other``: ``{seed: loss}`` at ``budget_tokens``. Only the
    seeds that every budget and ``other`` have are used."""
    if budget_tokens not in adamw:
        raise ValueError(f"AdamW has no runs at {budget_tokens:,.0f} tokens, the budget compared")
    seeds = sorted(set(other).intersection(*(set(v) for v in adamw.values())))
    if not seeds:
        raise ValueError("no evaluation seed shared by AdamW's budgets and the optimizer")
    budgets, means = _curve(adamw, seeds)
    x = float(np.mean([other[s] for s in seeds]))
    point = speedup_at(x, budget_tokens, budgets, means)
    if bootstrap:
        rng = np.random.default_rng(seed)
        values = []
        for _ in range(resamples):
            pick = [seeds[i] for i in rng.integers(0, len(seeds), len(seeds))]
            b, m = budgets, [float(np.mean([adamw[k][s] for s in pick])) for k in budgets]
            s = speedup_at(float(np.mean([other[p] for p in pick])), budget_tokens, b, m)
            values.append(s.value)
        q = percentile_interval(values, level)
        lo = speedup_at_value(q[0], point, budgets, budget_tokens)
        hi = speedup_at_value(q[1], point, budgets, budget_tokens)
        return SpeedupResult(point, lo, hi)
    per_seed = [speedup_at(other[s], budget_tokens, budgets, [adamw[b][s] for b in budgets])
                for s in seeds]  # fmt: skip
    logs = mean_interval([math.log(sp.value) for sp in per_seed], level)
    top, bottom = budgets[-1] / budget_tokens, budgets[0] / budget_tokens
    lo = speedup_at_value(math.exp(logs.lo), point, budgets, budget_tokens)
    hi = speedup_at_value(math.exp(logs.hi), point, budgets, budget_tokens)
    if not any(sp.censored for sp in per_seed):  # the point of the interval's own estimator
        point = Speedup(math.exp(logs.mean))
    if any(sp.side == ">" for sp in per_seed):  # a seed beyond the largest budget
        hi = Speedup(top, ">")
    if any(sp.side == "<" for sp in per_seed):
        lo = Speedup(bottom, "<")
    if any(sp.censored for sp in per_seed):
        # censored seeds enter the t-interval at their bound, which can put an end of the
        # interval past the point read at the mean loss: widen it to hold the point
        if not lo.censored and point.value < lo.value:
            lo = Speedup(point.value, point.side)
        if not hi.censored and point.value > hi.value:
            hi = Speedup(point.value, point.side)
    return SpeedupResult(point, lo, hi)


def speedup_at_value(value: float, point: Speedup, budgets: list, budget_tokens: float) -> Speedup:
    """A bootstrap quantile as a Speedup, censored at the measured budgets' bounds."""
    top, bottom = budgets[-1] / budget_tokens, budgets[0] / budget_tokens
    if value >= top - 1e-12:
        return Speedup(top, ">")
    if value <= bottom + 1e-12:
        return Speedup(bottom, "<")
    return Speedup(float(value))
