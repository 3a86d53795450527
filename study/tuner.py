"""Tuning to the joint optimum, chosen by the mean over several selection seeds.

Coordinate descent over the tuned keys (the lr first), pass after pass, until a whole pass moves
no key (at most ``max_passes``: a cap, flagged). Each key's search along its line (the other keys
at their current values) is a successive halving:

1. On the first selection seed, the key's lattice (study/knobs.py) from the current value, two
   values each side (``need``), extended past an edge until the best has ``need`` worse values
   on each side (at most ``cap`` values on the line: a cap, flagged).
2. The ``finalists`` best of those run on every other selection seed; the choice is the lowest
   mean over all selection seeds; a neighbour of the choice on the lattice that has not run on
   every seed joins the finalists (running on all of them), until the choice is bracketed by
   neighbours that are worse in the mean (or diverged on the first seed, or outside the
   lattice's bounds: ``edge``).

While stage 1 waits on a line's next values, ``ahead`` names the runs stage 2 will ask for if
those values come out worse than the present ``finalists`` best (the usual case): those
finalists on the other selection seeds, the best first. A scheduler with a slot that would idle
may start them; they change no decision (a run the search turns out not to need is one more
finished run on disk, read like any other). ``likely`` is the value the waiting line would choose
from what has run so far (stage 1: the best on the first seed; stage 2: the finalists' best mean
over the seeds each has finished); where only one key is tuned, ``Tuned.likely`` is that choice,
so a scheduler can run the evaluation seeds there once nothing else is left to look ahead to.

The search is a pure function of the losses on disk (``loss_of``), replayed from the start each
time the study looks: an interrupted study resumes where it stopped, and a finished line is
read, not rerun, when a later pass crosses it again.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from study.knobs import lattice

Point = dict  # {key: value}
LossOf = Callable[[Point, int], float | None]  # None: not finished; inf: diverged


@dataclass
class Line:
    key: str
    others: Point
    first: dict[float, float] = field(default_factory=dict)  # value: loss on the first seed
    means: dict[float, float] = field(default_factory=dict)  # value: mean over every seed
    best: float | None = None
    flag: str = "open"  # bracketed | capped | edge | open
    pending: list[tuple[Point, int]] = field(default_factory=list)
    ahead: list[tuple[Point, int]] = field(default_factory=list)  # likely next (module docstring)
    likely: float | None = None  # the value it would choose from what has run (module docstring)


@dataclass
class Tuned:
    chosen: Point
    flags: dict[str, str]
    lines: list[Line]
    passes: int
    converged: bool
    pending: list[tuple[Point, int]] = field(default_factory=list)
    ahead: list[tuple[Point, int]] = field(default_factory=list)
    likely: Point | None = None  # one tuned key: the choice the waiting line leans to

    @property
    def done(self) -> bool:
        return not self.pending


def _finite(x: float) -> float:
    return x if x is not None and math.isfinite(x) else math.inf


def _mean(values: list[float]) -> float:
    return math.inf if any(not math.isfinite(v) for v in values) else sum(values) / len(values)


def search_line(key: str, current: Point, seeds: list[int], loss_of: LossOf, *,
                finalists: int = 3, cap: int = 9) -> Line:  # fmt: skip
    """One key's search at the other keys' current values (module docstring)."""
    kn = lattice(key)
    line = Line(key, {k: v for k, v in current.items() if k != key})
    k0 = kn.index(current[key])

    def point(k: int) -> Point:
        return {**current, key: kn.value(k)}

    first = {}
    for k in range(k0 - 4 * cap, k0 + 4 * cap + 1):
        if kn.allowed(k) and (loss := loss_of(point(k), seeds[0])) is not None:
            first[k] = _finite(loss)
    line.first = {kn.value(k): v for k, v in sorted(first.items())}
    if not first:
        ks = [k for k in range(k0 - kn.need, k0 + kn.need + 1) if kn.allowed(k)]
        line.pending = [(point(k), seeds[0]) for k in ks]
        return line
    lo, hi = min(first), max(first)
    holes = [k for k in range(lo, hi + 1) if k not in first]
    if holes:  # an interrupted round: a bracket counts only on a whole stretch
        line.pending = [(point(k), seeds[0]) for k in holes]
        return line
    best1 = min(first, key=lambda k: (first[k], k))
    left, right = best1 - lo, hi - best1
    wanted = [lo - j for j in range(1, kn.need - left + 1)]
    wanted += [hi + j for j in range(1, kn.need - right + 1)]
    if all(math.isinf(v) for v in first.values()):  # everything diverged: go lower only
        wanted = [lo - j for j in range(1, kn.need + 1)]
    edge = any(not kn.allowed(k) for k in wanted)
    wanted = [k for k in wanted if kn.allowed(k)][: max(0, cap - len(first))]
    capped = len(first) >= cap and (left < kn.need or right < kn.need)
    if wanted:
        # the first round is the window around the start: its values not run yet come before
        # the extension past what has run (a single finished value, read before its window's
        # other values finish, would otherwise send a one-job study off the window's edge);
        # a line already bracketed asks for neither, so a finished line reads as before
        window = [k for k in range(k0 - kn.need, k0 + kn.need + 1) if kn.allowed(k) and
                  k not in first and not all(math.isinf(v) for v in first.values())]  # fmt: skip
        line.pending = [(point(k), seeds[0]) for k in dict.fromkeys(window + wanted)]
        ranked = sorted((k for k in first if math.isfinite(first[k])), key=lambda k: (first[k], k))
        line.ahead = [(point(k), s) for k in ranked[:finalists] for s in seeds[1:]
                      if loss_of(point(k), s) is None]  # fmt: skip
        line.likely = kn.value(ranked[0]) if ranked else None
        return line
    return _finals(line, kn, first, best1, point, seeds, loss_of, finalists=finalists, cap=cap,
                   flag="capped" if capped else "edge" if edge else "bracketed")  # fmt: skip


def _finals(line: Line, kn, first: dict, best1: int, point, seeds: list[int], loss_of: LossOf,  # noqa: ANN001
            *, finalists: int, cap: int, flag: str) -> Line:  # fmt: skip
    """Stage 2: the finalists on every selection seed, the choice by the mean, bracketed."""
    if len(seeds) == 1:
        line.best, line.flag = kn.value(best1), flag
        line.means = dict(line.first)
        return line
    ranked = sorted((k for k in first if math.isfinite(first[k])), key=lambda k: (first[k], k))
    chosen = set(ranked[:finalists]) or {best1}
    while True:
        missing = [(point(k), s) for k in sorted(chosen) for s in seeds
                   if loss_of(point(k), s) is None]  # fmt: skip
        if missing:
            line.pending = missing
            so_far = {k: [v for s in seeds if (v := loss_of(point(k), s)) is not None]
                      for k in chosen}  # fmt: skip
            so_far = {k: _mean([_finite(v) for v in vs]) for k, vs in so_far.items() if vs}
            lead = min(so_far, key=lambda k: (so_far[k], k), default=None)
            line.likely = (
                kn.value(lead) if lead is not None and math.isfinite(so_far[lead]) else None
            )
            return line
        means = {k: _mean([_finite(loss_of(point(k), s)) for s in seeds]) for k in chosen}
        best = min(means, key=lambda k: (means[k], k))
        grow, status = [], "bracketed"
        for nb in (best - 1, best + 1):
            if nb in chosen or (nb in first and math.isinf(first[nb])):
                continue
            if not kn.allowed(nb):
                status = "edge"
            elif nb not in first and len(first) >= cap:
                status = "capped"
            else:
                grow.append(nb)
        if not grow:
            line.means = {kn.value(k): v for k, v in sorted(means.items())}
            line.best = kn.value(best)
            line.flag = "capped" if flag == "capped" else status
            return line
        chosen |= set(grow)


def tune(keys: list[str], start: Point, seeds: list[int], loss_of: LossOf, *,
         finalists: int = 3, cap: int = 9, max_passes: int = 3) -> Tuned:  # fmt: skip
    """Coordinate descent over ``keys`` from ``start`` until a pass moves nothing (module
    docstring). ``start`` may hold more keys than are tuned (fixed values)."""
    current = {k: (lattice(k).snap(v) if k in keys else v) for k, v in start.items()}
    lines: list[Line] = []
    flags: dict[str, str] = {}
    for n in range(1, max_passes + 1):
        moved = False
        for key in keys:
            line = search_line(key, current, seeds, loss_of, finalists=finalists, cap=cap)
            lines.append(line)
            if line.pending:
                likely = (
                    {**current, key: line.likely}
                    if len(keys) == 1 and line.likely is not None
                    else None
                )
                return Tuned(dict(current), flags, lines, n, False, line.pending, line.ahead,
                             likely)  # fmt: skip
            moved |= not math.isclose(line.best, current[key], rel_tol=1e-9)
            current[key] = line.best
            flags[key] = line.flag
        if not moved:
            return Tuned(current, flags, lines, n, True)
    return Tuned(current, flags, lines, max_passes, False)


def final_line(tuned: Tuned, key: str) -> Line | None:
    """The last line searched for ``key`` (its grid, means and finalists for the report)."""
    return next((ln for ln in reversed(tuned.lines) if ln.key == key), None)
