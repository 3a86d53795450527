"""Loss against compute, fitted per optimizer, and the compute-fit speedup over the baseline.

Each optimizer's runs at different model sizes or token counts give points (C, L): C the
training compute in FLOPs (the model's training FLOPs per token, ``flops_per_token``, times the
run's tokens), L the mean over seeds of each seed's best validation loss. A point is one (size,
token count): of the variants at one compute (an lr sweep) the one with the lowest mean best loss.
Unfinished runs are left out. The fits, the speedup and its interval are analysis/compute_fit.py's
(``REPORT_RESAMPLES`` bootstrap resamples of each point's seeds, numpy seed ``BOOTSTRAP_SEED``).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from analysis.compute_fit import (
    MIN_POINTS,
    PowerLaw,
    bootstrap_laws,
    compute_fit_speedup,
    fit_power_law,
)
from analysis.stats import LEVEL, REPORT_RESAMPLES
from report.figures import plot_loss_fits
from report.runs import Run
from report.time_to_loss import BOOTSTRAP_SEED
from report.variants import Variant


def flops_per_token(model: dict[str, Any], seq_len: int | None = None) -> float | None:
    """Training FLOPs per token of a GPT-2 config (``model/gpt.py``'s ``flops_per_token``:
    6N + 12 L H Q T, N the parameters without the position embedding, the tied token embedding
    counted once); None when the config lacks a size."""
    try:
        n_layer, n_head, d = int(model["n_layer"]), int(model["n_head"]), int(model["n_embd"])
        vocab, block = int(model["vocab_size"]), int(model["block_size"])
    except (KeyError, TypeError, ValueError):
        return None
    bias = bool(model.get("bias", False))
    per_layer = 12 * d * d + 2 * d + (11 * d if bias else 0)  # weights, LN gains, biases
    params = vocab * d + n_layer * per_layer + d + (d if bias else 0)  # + the final LN
    seq = seq_len or block
    return float(6 * params + 12 * n_layer * n_head * (d // n_head) * seq)


def run_compute(run: Run) -> float | None:
    """Training FLOPs of a run: flops_per_token times its tokens (None when unknown)."""
    fpt = flops_per_token(run.config.get("model") or {}, run.config.get("seq_len"))
    return None if fpt is None or run.tokens <= 0 else fpt * run.tokens


# ---- from runs ------------------------------------------------------------------------------


@dataclass
class Point:
    """One (size, run length) of one optimizer: its compute and each seed's best loss."""

    size: str
    compute: float
    bests: list[float]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.bests)


def optimizer_points(variants: list[Variant], warnings: list[str]) -> list[Point]:
    """The fit's points of one (dataset, optimizer) from all its variants (module docstring)."""
    by_compute: dict[float, list[tuple[Variant, float]]] = {}
    for v in variants:
        done = [r for r in v.runs if r.finished]
        if len(done) < len(v.runs):
            warnings.append(
                f"loss fit {v.dataset} {v.size} {v.label}: {len(v.runs) - len(done)} unfinished "
                "run(s) left out"
            )
        computes = [c for r in done if (c := run_compute(r)) is not None]
        if computes:
            c = statistics.fmean(computes)
            by_compute.setdefault(round(math.log(c), 2), []).append((v, c))
    points = []
    for members in by_compute.values():
        scored = [
            (v, c, v.per_seed(lambda r: r.best_val_loss if r.finished else None))
            for v, c in members
        ]
        scored = [s for s in scored if s[2]]
        if scored:
            v, c, bests = min(scored, key=lambda s: statistics.fmean(s[2]))
            points.append(Point(v.size, c, bests))
    return sorted(points, key=lambda p: p.compute)


def law_row(label: str, points: list[Point], law: PowerLaw | None) -> dict[str, Any]:
    """One optimizer's fit and points, as report data."""
    return {
        "optimizer": label,
        "law": None if law is None else vars(law),
        "points": [
            {
                "size": p.size,
                "compute": p.compute,
                "mean": p.mean,
                "bests": p.bests,
                "n_seeds": len(p.bests),
            }
            for p in points
        ],
    }


def speedup_rows(
    points: list[Point],
    law: PowerLaw,
    base: PowerLaw,
    boot: tuple[list[PowerLaw | None], list[PowerLaw | None]] | None,
) -> list[dict[str, Any]]:
    """The compute-fit speedup at each of the optimizer's compute values, with its interval from
    the paired bootstrap fits ``boot`` (None: no interval, one seed per point)."""
    return [
        {"size": p.size, "compute": p.compute, **compute_fit_speedup(law, base, p.compute, boot)}
        for p in points
    ]


def dataset_fit(
    by_label: dict[str, list[Variant]], baseline: str, warnings: list[str], resamples: int
) -> dict[str, Any] | None:
    """One dataset's fits and effective speedups; None when no optimizer has enough points."""
    points = {lab: optimizer_points(vs, warnings) for lab, vs in by_label.items()}
    points = {lab: ps for lab, ps in points.items() if len(ps) >= MIN_POINTS}
    if not points:
        return None
    laws = {
        lab: fit_power_law([p.compute for p in ps], [p.mean for p in ps])
        for lab, ps in points.items()
    }
    out: dict[str, Any] = {
        "baseline": baseline,
        "laws": [law_row(lab, ps, laws[lab]) for lab, ps in points.items()],
        "speedups": [],
        "note": None,
    }
    base = laws.get(baseline)
    if base is None:
        out["note"] = (
            f"no effective speedups: {baseline} has fewer than {MIN_POINTS} compute points "
            "or its loss does not fall with compute"
        )
        return out
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    seeded = any(len(p.bests) > 1 for p in points[baseline])
    base_boot = _bootstrap(points[baseline], rng, resamples) if seeded else None
    for lab, ps in points.items():
        if lab == baseline or laws[lab] is None:
            continue
        boot = None
        if base_boot is not None and any(len(p.bests) > 1 for p in ps):
            boot = (_bootstrap(ps, rng, resamples), base_boot)
        out["speedups"].append(
            {
                "optimizer": lab,
                "at": speedup_rows(ps, laws[lab], base, boot),
                "interval": boot is not None,
            }
        )
    return out


def _bootstrap(points: list[Point], rng: np.random.Generator, resamples: int) -> list:
    return bootstrap_laws([p.compute for p in points], [p.bests for p in points], rng, resamples)


def fit_sections(
    groups: dict[tuple[str, str, str], list[Variant]],
    baseline: str,
    warnings: list[str],
    *,
    resamples: int = REPORT_RESAMPLES,
) -> list[dict[str, Any]]:
    """Per dataset with an optimizer run at ``MIN_POINTS`` or more compute values: the fits,
    their points and the effective speedups over ``baseline``."""
    sections = []
    for dataset in dict.fromkeys(k[0] for k in groups):
        by_label: dict[str, list[Variant]] = {}
        for (ds, _, label), vs in groups.items():
            if ds == dataset:
                by_label.setdefault(label, []).extend(vs)
        if (fit := dataset_fit(by_label, baseline, warnings, resamples)) is not None:
            sections.append({"dataset": dataset, **fit})
    return sections


def fit_figures(fits: list[dict[str, Any]], out: Path) -> list[dict[str, Any]]:
    """One PNG per dataset with loss fits: each optimizer's points and fitted L(C)."""
    made = []
    for f in fits:
        slug = "".join(c if c.isalnum() or c in "-." else "-" for c in f["dataset"].lower())
        name = f"loss_fit_{slug}.png"
        plot_loss_fits(f["laws"], title=f"{f['dataset']}: loss against compute", path=out / name)
        what = f"{f['dataset']}: best validation loss against training FLOPs, fitted L(C)"
        made.append(
            {
                "dataset": f["dataset"],
                "size": "",
                "file": name,
                "what": what,
                "caption": None,
                "caveats": [],
            }
        )
    return made


def _ratio_text(r: dict[str, Any], interval_: bool) -> str:
    text = "∞ (beyond the baseline's L_inf)" if math.isinf(r["ratio"]) else f"{r['ratio']:.2f}x"
    if not interval_:
        return text + " (1 seed per point: no interval)"
    if r["lo"] is None:
        return text + f" (no interval: all {r['failed_fits']} resampled fits failed)"
    hi = "∞" if math.isinf(r["hi"]) else f"{r['hi']:.2f}x"
    return text + f" [{r['lo']:.2f}x, {hi}]" + (" (within noise)" if r["within_noise"] else "")


def fit_tables(section: dict[str, Any]) -> list[tuple[list[str], list[list[str]]]]:
    """The markdown tables of one dataset's fits: the laws, then the effective speedups."""
    laws = []
    for f in section["laws"]:
        law = f["law"]
        fitted = (
            ["–", "–", "–"]
            if law is None
            else [f"{law['l_inf']:.3f}", f"{law['a']:.4g}", f"{law['alpha']:.4f}"]
        )
        pts = "; ".join(
            f"{p['size']}: {p['compute']:.3g} FLOPs, {p['mean']:.3f} "
            f"({p['n_seeds']} seed{'s' * (p['n_seeds'] != 1)})"
            for p in f["points"]
        )
        laws.append([f["optimizer"], *fitted, pts])
    out = [(["optimizer", "L_inf", "A", "alpha", "points (size: compute, mean best loss)"], laws)]
    speed = [
        [s["optimizer"], r["size"], f"{r['compute']:.3g}", _ratio_text(r, s["interval"])]
        for s in section["speedups"]
        for r in s["at"]
    ]
    if speed:
        head = [
            "optimizer",
            "size",
            "compute C (FLOPs)",
            f"effective speedup over {section['baseline']}",
        ]
        out.append((head, speed))
    return out


def method_note(baseline: str) -> str:
    """How the fits and effective speedups are made, for the report."""
    return (
        "L(C) = L_inf + A C^-alpha fitted per optimizer by least squares to its mean best "
        "validation loss at each compute C = training FLOPs per token x tokens (runs at several "
        "model sizes or token counts; the lowest-loss variant at each). With three points the fit "
        f"interpolates them. Effective speedup at C: the compute {baseline}'s fit needs to reach "
        f"the optimizer's fitted loss at C, over C; in brackets the {LEVEL:.0%} interval from "
        f"{REPORT_RESAMPLES} bootstrap resamples of each point's seeds (numpy seed {BOOTSTRAP_SEED}), "
        "both fits redone; a resample whose fit does not fall with compute is dropped."
    )
