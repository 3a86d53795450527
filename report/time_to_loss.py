"""Time-to-loss speedups over the baseline (AdamW) for ``python -m report``: per (dataset, size)
each optimizer's speedup in tokens and in wall-clock seconds side by side, with its bootstrap
interval over seeds (the estimator: analysis/time_to_loss.py, ``REPORT_RESAMPLES`` resamples,
numpy ``default_rng(BOOTSTRAP_SEED + the row's index)``), and their Markdown.

- Curves: each seed's evaluations (replicas of one seed averaged first), the mean over seeds.
- With one seed (the optimizer's or the baseline's) there is no interval, and the cell says so.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from analysis.stats import LEVEL, REPORT_RESAMPLES  # the one level of every interval
from analysis.time_to_loss import Curves, time_to_loss_speedup, x_of_best
from report.variants import Variant, format_tokens, seed_curve, seed_matrix

BOOTSTRAP_SEED = 0


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


def speedup_section(
    variants: dict[str, Variant], baseline: str, *, resamples: int = REPORT_RESAMPLES
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
                "tokens": time_to_loss_speedup(base_tok, tok, resamples=resamples, seed=seed),
                "time": time_to_loss_speedup(
                    base_time, variant_curves(v, timed=True), resamples=resamples, seed=seed
                ),
            }
        )
    return {
        "baseline": baseline,
        "baseline_variant": base.describe(),
        "n_seeds_base": len(base.seeds),
        "best_loss": float(base_tok[1].mean(axis=0).min()),
        "tokens_base": x_of_best(base_tok),
        "time_base": None if base_time is None else x_of_best(base_time),
        "baseline_finished": all(r.finished for r in base.runs),
        "rows": rows,
    }


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
        f"{LEVEL:.0%} interval from {REPORT_RESAMPLES} bootstrap resamples of the seeds (each "
        f"optimizer's and {baseline}'s, with replacement; numpy seed {BOOTSTRAP_SEED} + the "
        "row's index); within noise: the interval contains 1.0x. One seed: no interval. Not "
        "reached: the optimizer never gets down to L* in its run, so its speedup is below "
        f"{baseline}'s tokens over its whole run's. Wall-clock speedups compare machines as "
        "much as optimizers unless the runs were made alike (see the figures' cautions)."
    )
