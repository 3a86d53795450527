"""Speedups over the baseline (AdamW) with a bootstrap interval over seeds, for ``python -m report``.

The target is the baseline's best validation loss L* (the minimum of its seed-mean curve; with a
decaying schedule it is the final loss). An optimizer's speedup is the baseline's tokens (or
wall-clock seconds) to first reach L* over the optimizer's: step-wise (tokens) and wall-clock side
by side.

- Curves: each seed's evaluations (replicas of one seed averaged first), the mean over seeds.
- Between two evaluations the loss is interpolated linearly in log x (log tokens, log seconds),
  closer to a loss curve's shape than linear in x; from x = 0 (the step-0 evaluation) linearly.
- An optimizer that never gets down to L* within its run is "not reached": its speedup is below
  the baseline's x over its whole run's x (it would need more tokens than its whole run).
- Interval: ``RESAMPLES`` bootstrap resamples (numpy ``default_rng(BOOTSTRAP_SEED + the row's
  index)``, so a report is reproducible):
  each optimizer's seeds, the baseline's included, resampled with replacement, L* and the speedup
  recomputed; the 5th and 95th percentiles give the 90% interval. A resample that does not
  reach L* counts as the lowest speedup. The speedup is within noise when the interval contains
  1.0x. With one seed (the optimizer's or the baseline's) there is no interval, and the cell says
  so.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from analysis.stats import LEVEL  # the one level of every interval
from report.analysis import Variant, format_tokens, seed_curve, seed_matrix

RESAMPLES = 1000
BOOTSTRAP_SEED = 0

Curves = tuple[np.ndarray, np.ndarray]  # (grid x, per-seed losses: seeds x grid)


def variant_curves(variant: Variant, *, timed: bool) -> Curves | None:
    """A variant's per-seed validation curves against tokens, or against elapsed seconds
    (``timed``; seeds with a run lacking ``elapsed_s`` left out)."""
    per_seed = []
    for runs in variant.by_seed().values():
        replicas = []
        for r in runs:
            xs = [p.elapsed_s if timed else p.tokens for p in r.evals]
            if r.evals and all(x is not None for x in xs):
                replicas.append((np.array(xs, dtype=float), np.array([p.loss for p in r.evals])))
        if (mean := seed_curve(replicas)) is not None:
            per_seed.append((mean["x"], mean["mean"]))
    return seed_matrix(per_seed)


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


def speedup_cell(
    base: Curves | None, other: Curves | None, *, resamples: int = RESAMPLES, seed: int = 0
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
    tail = (1 - LEVEL) / 2
    lo, hi = np.quantile(ratios, [tail, 1 - tail])
    cell.update(
        lo=float(lo) if lo > 0 else None,
        hi=float(hi) if hi > 0 else None,
        censored=bool(lo <= 0),
        reached_fraction=float(np.mean(ratios > 0)),
        within_noise=bool(lo <= 1.0 <= hi),
    )
    return cell


def time_to_loss_speedup(
    variants: dict[str, Variant], baseline: str, *, resamples: int = RESAMPLES
) -> dict[str, Any] | None:
    """The speedups of one (dataset, size): ``variants`` maps labels to the chosen variants.
    None when the baseline has no validation curve here."""
    base = variants.get(baseline)
    base_tok = variant_curves(base, timed=False) if base else None
    if base_tok is None:
        return None
    base_time = variant_curves(base, timed=True)
    rows = []
    for k, (label, v) in enumerate((lab, v) for lab, v in variants.items() if lab != baseline):
        tok, seed = variant_curves(v, timed=False), BOOTSTRAP_SEED + k
        rows.append(
            {
                "optimizer": label,
                "variant": v.describe(),
                "n_seeds": len(v.seeds),
                "best_loss": float(tok[1].mean(axis=0).min()) if tok else None,
                "finished": all(r.finished for r in v.runs),
                "tokens": speedup_cell(base_tok, tok, resamples=resamples, seed=seed),
                "time": speedup_cell(
                    base_time, variant_curves(v, timed=True), resamples=resamples, seed=seed
                ),
            }
        )
    return {
        "baseline": baseline,
        "baseline_variant": base.describe(),
        "n_seeds_base": len(base.seeds),
        "best_loss": float(base_tok[1].mean(axis=0).min()),
        "tokens_base": _x_of_best(base_tok),
        "time_base": None if base_time is None else _x_of_best(base_time),
        "baseline_finished": all(r.finished for r in base.runs),
        "rows": rows,
    }


def _x_of_best(curves: Curves) -> float:
    """Where the seed-mean curve is lowest (first reaches its minimum)."""
    return float(curves[0][int(np.argmin(curves[1].mean(axis=0)))])


# ---- markdown -------------------------------------------------------------------------------


def format_seconds(seconds: float) -> str:
    """``42 s``, ``3.5 min``, ``2.1 h``."""
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.2g} h"
    if seconds >= 120:
        return f"{seconds / 60:.3g} min"
    return f"{seconds:.3g} s"


def cell_text(cell: dict[str, Any] | None, best_loss: float | None = None) -> str:
    """``1.28x [1.05x, 1.52x]``, ``… (within noise)``, ``1.30x (1 seed: no interval)``,
    ``in progress (no evaluation after step 0 yet)`` or ``not reached (< 0.80x: more than its
    whole run; its best 6.300 > L* 6.231)``: the best of this cell's own curve (the wall-clock
    curve averages the seeds at equal seconds, so its best is not the tokens curve's)."""
    if cell is None:
        return "–"
    if cell.get("in_progress"):
        return "in progress (no evaluation after step 0 yet)"
    if cell["ratio"] is None:
        best = cell.get("best", best_loss)
        target = f" > L* {cell['target']:.3f}" if "target" in cell else ""
        best = "" if best is None else f"; its best {best:.3f}{target}"
        return f"not reached (< {cell['bound']:.2f}x: more than its whole run{best})"
    text = f"{cell['ratio']:.2f}x"
    if not cell["interval"]:
        return text + " (1 seed: no interval)"
    lo = "not reached" if cell["censored"] else f"{cell['lo']:.2f}x"
    hi = "not reached" if cell["hi"] is None else f"{cell['hi']:.2f}x"
    return text + f" [{lo}, {hi}]" + (" (within noise)" if cell["within_noise"] else "")


def speedup_table(s: dict[str, Any]) -> tuple[str, list[str], list[list[str]]]:
    """One (dataset, size) for the markdown: the line on the baseline's L*, then the table's
    headers and rows (per optimizer both speedups)."""
    variant = s["baseline_variant"]
    when = f"first reached at {format_tokens(s['tokens_base'])} tokens"
    if s["time_base"] is not None:
        when += f" ({format_seconds(s['time_base'])})"
    seeds = s["n_seeds_base"]
    head = (
        f"Baseline {s['baseline']}{'' if variant.startswith('(') else f' ({variant})'}, "
        f"{seeds} seed{'s' * (seeds != 1)}: best validation loss L* = {s['best_loss']:.3f}, {when}"
        + ("" if s["baseline_finished"] else " (baseline unfinished: L* may still fall)")
    )
    rows = []
    for r in s["rows"]:
        tok, tim = r["tokens"], r["time"]
        rows.append(
            [
                r["optimizer"],
                r["variant"],
                str(r["n_seeds"]),
                "–" if tok is None or tok["x"] is None else format_tokens(tok["x"]),
                cell_text(tok, r["best_loss"]),
                "–" if tim is None or tim["x"] is None else format_seconds(tim["x"]),
                cell_text(tim, r["best_loss"]),
                "finished" if r["finished"] else "unfinished",
            ]
        )
    headers = ["optimizer", "variant", "seeds", "tokens to L*", "speedup (tokens)",
               "time to L*", "speedup (wall-clock)", "status"]  # fmt: skip
    return head, headers, rows


def method_note(baseline: str) -> str:
    """How the speedups are computed, for the report."""
    return (
        f"Tokens (and wall-clock seconds) {baseline} needs to first reach its best validation "
        "loss L*, over those each optimizer needs; seed-mean curves, the loss interpolated "
        "linearly in log tokens (log seconds) between evaluations. In brackets the "
        f"{LEVEL:.0%} interval from {RESAMPLES} bootstrap resamples of the seeds (each "
        f"optimizer's and {baseline}'s, with replacement; numpy seed {BOOTSTRAP_SEED} + the "
        "row's index); within noise: the interval contains 1.0x. One seed: no interval. Not "
        "reached: the optimizer never gets down to L* in its run, so its speedup is below "
        f"{baseline}'s tokens over its whole run's. Wall-clock speedups compare machines as "
        "much as optimizers unless the runs were made alike (see the figures' cautions)."
    )
