"""The lr grid of the study's tuning: geometric, extended until the best value is bracketed.

A grid is the values ``center * factor**k``. After each round the best (lowest loss; a diverged
run, NaN or missing, counts as worst) must have at least ``need`` worse values on each side; the
next round asks for the missing ones beyond the grid's edge on the short side. A cap on the number
of values stops a search that keeps running off the grid; the result then says so (``capped``),
and the study prints it loudly and records it in results.csv.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FACTOR = 2.0
NEED = 2  # worse values on each side of the best
CAP = 9  # most values per tuned key and cell


def grid_value(center: float, k: int, factor: float = FACTOR) -> float:
    """``center * factor**k`` at 4 significant digits, so the same value always gets the same
    name (run directories, results.csv)."""
    return float(f"{center * factor**k:.4g}")


def initial_grid(center: float, need: int = NEED, factor: float = FACTOR) -> list[float]:
    """The first round: the center and ``need`` values each side."""
    return [grid_value(center, k, factor) for k in range(-need, need + 1)]


def _loss(v: float | None) -> float:
    return math.inf if v is None or math.isnan(v) else v


@dataclass(frozen=True)
class GridState:
    best: float | None  # the best value so far (None: nothing finished)
    next: list[float]  # values to run next (empty: bracketed or capped)
    bracketed: bool
    capped: bool


def step(results: dict[float, float | None], center: float, *, need: int = NEED,
         factor: float = FACTOR, cap: int = CAP) -> GridState:  # fmt: skip
    """What the grid needs next, given ``{value: loss}`` of the finished runs (None: diverged)."""
    if not results:
        return GridState(None, initial_grid(center, need, factor), False, False)
    values = sorted(results)
    ks = sorted(round(math.log(v / center, factor)) for v in values)
    holes = sorted(set(range(ks[0], ks[-1] + 1)) - set(ks))
    best = min(values, key=lambda v: (_loss(results[v]), v))
    if holes:  # an interrupted round left gaps: a bracket counts only on a whole grid
        return GridState(best, [grid_value(center, k, factor) for k in holes], False, False)
    i = values.index(best)
    left, right = i, len(values) - 1 - i
    if left >= need and right >= need:
        return GridState(best, [], True, False)
    wanted = [grid_value(center, ks[0] - j, factor) for j in range(1, need - left + 1)]
    wanted += [grid_value(center, ks[-1] + j, factor) for j in range(1, need - right + 1)]
    if all(math.isinf(_loss(results[v])) for v in values):  # all diverged: go lower only
        wanted = [grid_value(center, ks[0] - j, factor) for j in range(1, need + 1)]
    room = cap - len(values)
    if room <= 0:
        return GridState(best, [], False, True)
    return GridState(best, wanted[:room], False, False)
