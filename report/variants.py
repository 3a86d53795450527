"""The numbers of ``python -m report``: variants, seeds, token columns and curves.

Runs of one (dataset, model size, optimizer label) whose configs differ only in the seed and
bookkeeping keys are seeds of one *variant*; runs differing in anything else (an lr sweep) are
different variants, and a table cell uses the variant with the lowest mean best validation loss.
Runs are seeds by their seed value: runs sharing one (a rerun, or the same seed on another number
of processes) are one seed, whose value is the mean of theirs, and the report says so.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import yaml

from report.published import Published
from report.runs import Run, order_key

PAPER_COLUMNS = {"5B": 5e9, "20B": 20e9, "50B": 50e9}  # the published tables' token columns
# A run within this fraction of a column's tokens has reached it (the paper's "50B" is 49.15B tokens).
REACH_TOLERANCE = 0.02
# A cell whose last evaluation lies more than this fraction of its column's tokens before them is
# marked: its value is the loss then, not at the column's tokens.
EVAL_GAP = 0.1
AUTO_FRACTIONS = (0.1, 0.4, 1.0)


# ---- variants ---------------------------------------------------------------------------------


@dataclass
class Variant:
    """Seeds of one configuration of one (dataset, size, label)."""

    dataset: str
    size: str
    label: str
    runs: list[Run]
    keys: dict[str, Any] = field(default_factory=dict)  # values of keys differing between variants
    chosen: bool = False

    def by_seed(self) -> dict[str, list[Run]]:
        """Seed value -> its runs; several runs of one seed (e.g. on 1 and on 2 processes) are
        replicas of one seed, not several seeds."""
        out: dict[str, list[Run]] = {}
        for r in self.runs:
            out.setdefault(str(r.seed), []).append(r)
        return out

    @property
    def seeds(self) -> list[Any]:
        """The distinct seed values, in run order."""
        return [rs[0].seed for rs in self.by_seed().values()]

    def per_seed(self, value: Callable[[Run], float | None]) -> list[float]:
        """Per seed the mean of ``value`` over its runs that have one (seeds with none left out)."""
        out = []
        for rs in self.by_seed().values():
            values = [v for v in map(value, rs) if v is not None]
            if values:
                out.append(statistics.fmean(values))
        return out

    @property
    def bests(self) -> list[float]:
        return self.per_seed(lambda r: r.best_val_loss)

    @property
    def best_mean(self) -> float | None:
        return statistics.fmean(self.bests) if self.bests else None

    @property
    def best_std(self) -> float | None:
        return statistics.stdev(self.bests) if len(self.bests) > 1 else None

    def describe(self) -> str:
        """``optimizer.lr=0.003, max_steps=2000``, or ``(only variant)``."""
        return ", ".join(f"{k}={v}" for k, v in self.keys.items()) or "(only variant)"


def _freeze(items: dict[str, Any]) -> str:
    return yaml.safe_dump(items, sort_keys=True)


def group_variants(
    runs: list[Run], warnings: list[str]
) -> dict[tuple[str, str, str], list[Variant]]:
    """(dataset, size, label) -> its variants, the chosen one (lowest mean best loss) first."""
    by_group: dict[tuple[str, str, str], dict[str, list[Run]]] = {}
    for run in runs:
        group = by_group.setdefault((run.dataset, run.size, run.label), {})
        group.setdefault(_freeze(run.variant_items), []).append(run)
    out = {}
    for key, members in by_group.items():
        variants = [Variant(*key, runs=rs) for rs in members.values()]
        all_keys = sorted({k for v in variants for k in v.runs[0].variant_items})
        differing = [
            k
            for k in all_keys
            if len({repr(v.runs[0].variant_items.get(k, "<absent>")) for v in variants}) > 1
        ]
        for v in variants:
            v.keys = {k: v.runs[0].variant_items.get(k, "<absent>") for k in differing}
            v.runs.sort(key=lambda r: (str(r.seed), str(r.path)))
            warnings.extend(shared_seed_notes(key, v))
        variants.sort(key=lambda v: (v.best_mean is None, v.best_mean or 0.0, -len(v.runs)))
        variants[0].chosen = True
        out[key] = variants
    return dict(
        sorted(
            out.items(),
            key=lambda kv: (
                order_key("dataset", kv[0][0]),
                order_key("size", kv[0][1]),
                order_key("label", kv[0][2]),
            ),
        )
    )


def shared_seed_notes(key: tuple[str, str, str], variant: Variant) -> list[str]:
    """One line per seed that several runs of ``variant`` share: they count as one seed."""
    out = []
    for seed, rs in variant.by_seed().items():
        if len(rs) < 2:
            continue
        sizes = {r.conditions.world_size for r in rs}
        procs = ", ".join(f"{r.path.name} ({r.conditions.world_size or '?'} proc.)" for r in rs)
        why = "different numbers of processes" if len(sizes) > 1 else "a rerun?"
        out.append(
            f"{' '.join(key)} {variant.describe()}: runs {procs} share seed {seed} ({why}); "
            "counted as one seed, the mean of the runs"
        )
    return out


# ---- token columns and table cells ---------------------------------------------------------


@dataclass(frozen=True)
class TokenColumn:
    """A column: best loss among evals at <= ``tokens`` tokens (None: the whole run)."""

    label: str
    tokens: float | None
    paper: str | None = None  # the published column it matches (5B, 20B, 50B)


def format_tokens(tokens: float, like: float | None = None) -> str:
    """5e9 -> 5B, 2.5e5 -> 0.25M, 30720 -> 30.7K; in the unit ``like`` would get, if given."""
    size = tokens if like is None else like
    if size >= 1e9:
        return f"{tokens / 1e9:.3g}B"
    if size >= 1e5:
        return f"{tokens / 1e6:.3g}M"
    return f"{tokens / 1e3:.3g}K"


def parse_at_tokens(spec: str) -> list[float] | None:
    """``auto`` -> None; ``5e9,20e9,50e9`` (or ``5B,20B,50B``, ``250M``) -> token counts."""
    if spec.strip() == "auto":
        return None
    values = []
    for part in spec.split(","):
        text = part.strip()
        scale = {"B": 1e9, "M": 1e6, "K": 1e3}.get(text[-1:].upper(), 1.0)
        try:
            value = float(text[:-1] if scale != 1.0 else text) * scale
        except ValueError:
            value = -1.0
        if not value > 0:
            raise ValueError(
                f"bad token count {part!r} in --at-tokens {spec!r}; use auto or token "
                "counts such as 5e9,20e9,50e9 (or 5B,20B,50B)"
            )
        values.append(value)
    return sorted(values)


def token_columns(values: list[float] | None, longest: float) -> list[TokenColumn]:
    """The columns of one dataset's table; ``longest`` is its longest run's token count.

    auto: the paper's 5B/20B/50B (50B = the whole run) when the longest run has >= 1e9 tokens,
    else 10%/40%/100% of the longest run (100% = the whole run).
    """
    if values is None and longest >= 1e9:
        return [
            TokenColumn("5B", 5e9, "5B"),
            TokenColumn("20B", 20e9, "20B"),
            TokenColumn("50B", None, "50B"),
        ]
    if values is None:
        return [
            TokenColumn(format_tokens(f * longest, like=longest), None if f == 1.0 else f * longest)
            for f in AUTO_FRACTIONS
        ]
    paper = {v: k for k, v in PAPER_COLUMNS.items()}
    return [TokenColumn(format_tokens(v), v, paper.get(v)) for v in values]


def reached(run: Run, column: TokenColumn) -> bool:
    """Has ``run`` trained through ``column``'s tokens (so that its cell will not change any more)?"""
    if column.tokens is None:
        return run.finished
    return run.tokens >= column.tokens * (1 - REACH_TOLERANCE)


def variant_cell(variant: Variant, column: TokenColumn, published: Published) -> dict[str, Any]:
    """One table cell: mean (± std) over seeds of the best loss within the column's tokens.

    Evaluations after step 0 only (``Run.trained_evals``); ``early`` marks a reached column whose
    last evaluation came more than EVAL_GAP of it before (the value is the loss then).
    """
    bests = variant.per_seed(lambda r: r.best_within(column.tokens))
    last = [t for t in (r.last_eval_within(column.tokens) for r in variant.runs) if t is not None]
    cell: dict[str, Any] = {
        "size": variant.size,
        "column": column.label,
        "column_tokens": column.tokens,
        "mean": statistics.fmean(bests) if bests else None,
        "std": statistics.stdev(bests) if len(bests) > 1 else None,
        "n_seeds": len(bests),
        "reached": all(reached(r, column) for r in variant.runs),
        "eval_tokens": min(last, default=None),
        "early": False,
        "paper": None,
        "paper_approximate": None,
        "paper_source": None,
        "diff": None,
    }
    if column.tokens is not None and last and cell["reached"]:
        cell["early"] = min(last) < (1 - EVAL_GAP) * column.tokens
    pub = column.paper and published.val_loss(
        variant.dataset, variant.size, variant.label, column.paper
    )
    if pub:
        cell.update(
            paper=pub["value"], paper_approximate=pub["approximate"], paper_source=pub["source"]
        )
        if cell["mean"] is not None:
            cell["diff"] = round(round(cell["mean"], 3) - pub["value"], 3)  # as displayed
    return cell


# ---- curves (the time-to-loss speedups: report/time_to_loss.py) -----------------------------------


def seed_matrix(curves: list[tuple[np.ndarray, np.ndarray]]
                ) -> tuple[np.ndarray, np.ndarray] | None:  # fmt: skip
    """Per-seed curves on one grid: the union of their x within their common range, each seed
    interpolated linearly onto it (on a grid the seeds share, exactly their values)."""
    curves = [(x, y) for x, y in curves if len(x)]
    if not curves:
        return None
    lo_x, hi_x = max(x[0] for x, _ in curves), min(x[-1] for x, _ in curves)
    grid = np.unique(np.concatenate([x[(x >= lo_x) & (x <= hi_x)] for x, _ in curves]))
    if not len(grid):
        return None
    return grid, np.stack([np.interp(grid, x, y) for x, y in curves])


def seed_curve(curves: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray] | None:
    """Mean, min and max over seeds of ``seed_matrix``."""
    matrix = seed_matrix(curves)
    if matrix is None:
        return None
    grid, ys = matrix
    return {"x": grid, "mean": ys.mean(axis=0), "lo": ys.min(axis=0), "hi": ys.max(axis=0)}


def per_seed_curve(
    variant: Variant, points: Callable[[Run], tuple[np.ndarray, np.ndarray] | None]
) -> dict[str, np.ndarray] | None:
    """``seed_curve`` over seeds, each seed's curve the mean of its runs' ``points``."""
    curves = []
    for rs in variant.by_seed().values():
        replicas = [c for c in map(points, rs) if c is not None]
        if (mean := seed_curve(replicas)) is not None:
            curves.append((mean["x"], mean["mean"]))
    return seed_curve(curves)


def token_curve(variant: Variant) -> dict[str, np.ndarray] | None:
    """The seed-mean validation curve against tokens (``seed_curve``)."""
    return per_seed_curve(
        variant,
        lambda r: (np.array([p.tokens for p in r.evals]), np.array([p.loss for p in r.evals])),
    )


def time_curve(variant: Variant) -> tuple[dict[str, np.ndarray] | None, list[Run]]:
    """The curve against wall-clock seconds, and the runs left out for lacking ``elapsed_s``."""
    untimed = [r for r in variant.runs if any(p.elapsed_s is None for p in r.evals)]
    left_out = {id(r) for r in untimed}

    def points(r: Run) -> tuple[np.ndarray, np.ndarray] | None:
        if id(r) in left_out or not r.evals:
            return None
        return np.array([p.elapsed_s for p in r.evals]), np.array([p.loss for p in r.evals])

    return per_seed_curve(variant, points), untimed
