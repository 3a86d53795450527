"""Data-equivalent speedups: how much data AdamW needs to reach another optimizer's loss.

AdamW (the reference) is trained, each budget with its own full schedule, at several budgets D_k
(tokens); its mean end-of-run validation loss over the evaluation seeds at each is L_k. Loss can
only fall with more data, so a rise between budgets is seed noise: the L_k are made monotone
(non-increasing, pool-adjacent-violators), then log D is interpolated linearly in L between
neighbouring budgets. An optimizer X trained on D tokens with mean loss L_X has speedup
``D_AdamW(L_X) / D``. Outside the measured budgets nothing is guessed: a loss below AdamW's at its
largest budget is censored (``>4.00x`` with 1x..4x budgets), one above its smallest budget too
(``<1.00x``); the bound is printed.

Interval: the paired t-interval of X's loss gap to AdamW at X's own budget (the same seeds),
mapped through AdamW's mean curve, so the seeds' pairing carries over; ``bootstrap=True``
resamples the seeds whole instead (every budget and X together), which adds the noise of AdamW's
other budgets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from study.stats import LEVEL, paired_interval


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


def data_needed(loss: float, tokens, losses) -> tuple[float, str]:  # noqa: ANN001
    """(D, "") with AdamW's interpolated curve at ``loss`` = D tokens; (bound, ">" or "<") when
    ``loss`` lies beyond the measured budgets. ``tokens`` ascending, ``losses`` their means."""
    d = np.asarray(tokens, dtype=float)
    curve = isotonic_decreasing(losses)
    if loss < curve[-1]:
        return float(d[-1]), ">"
    if loss > curve[0]:
        return float(d[0]), "<"
    for i in range(len(d) - 1):
        hi, lo = curve[i], curve[i + 1]
        if hi >= loss >= lo:
            if hi == lo:  # a flat stretch: the first budget that reaches it
                return float(d[i]), ""
            frac = (hi - loss) / (hi - lo)
            return float(math.exp(math.log(d[i]) + frac * math.log(d[i + 1] / d[i]))), ""
    return float(d[0]), ""  # loss == curve[0] with one budget


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


def speedup(adamw: dict, other: dict, budget_tokens: float, *, level: float = LEVEL,
            bootstrap: bool = False, resamples: int = 2000, seed: int = 0) -> SpeedupResult:  # fmt: skip
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
        q = np.quantile(values, [0.5 - level / 2, 0.5 + level / 2])
        lo, hi = speedup_at_value(q[0], point, budgets, budget_tokens), None
        hi = speedup_at_value(q[1], point, budgets, budget_tokens)
        return SpeedupResult(point, lo, hi)
    gap = paired_interval(
        {s: adamw[budget_tokens][s] for s in seeds}, {s: other[s] for s in seeds}, level
    )
    base = float(np.mean([adamw[budget_tokens][s] for s in seeds]))
    lo = speedup_at(base + gap.hi, budget_tokens, budgets, means)  # the worse loss: less data
    hi = speedup_at(base + gap.lo, budget_tokens, budgets, means)
    return SpeedupResult(point, lo, hi)


def speedup_at_value(value: float, point: Speedup, budgets: list, budget_tokens: float) -> Speedup:
    """A bootstrap quantile as a Speedup, censored at the measured budgets' bounds."""
    top, bottom = budgets[-1] / budget_tokens, budgets[0] / budget_tokens
    if value >= top - 1e-12:
        return Speedup(top, ">")
    if value <= bottom + 1e-12:
        return Speedup(bottom, "<")
    return Speedup(float(value))
