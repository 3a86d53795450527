"""The report's sections as plain data (what report.json holds and report.md renders), and its
figures: built from the runs read by ``report_runs`` with the numbers of ``report_variants``."""

from __future__ import annotations

import datetime
import statistics
from pathlib import Path
from typing import Any

from evals import tasks as et
from report import ablations as abl
from report import conditions as rcond
from report import figures as figs
from report import fits as rfits
from report import runs as rr
from report import time_to_loss as rspeed
from report import variants as ana
from runtime import runfiles

Groups = dict[tuple[str, str, str], list[ana.Variant]]


def rel(path: Path) -> str:
    """``path`` relative to the working directory when below it (shorter tables)."""
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def variant_rows(groups: Groups) -> list[dict[str, Any]]:
    """Every variant of every (dataset, size, optimizer), the chosen one first."""
    return [
        {
            "dataset": v.dataset,
            "size": v.size,
            "optimizer": v.label,
            "variant": v.describe(),
            "keys": v.keys,
            "seeds": v.seeds,  # distinct: runs sharing a seed are one seed
            "runs": [rel(r.path) for r in v.runs],
            "best_mean": v.best_mean,
            "best_std": v.best_std,
            "chosen": v.chosen,
        }
        for vs in groups.values()
        for v in vs
    ]


def run_rows(runs: list[rr.Run], variant_of: dict[Path, ana.Variant]) -> list[dict[str, Any]]:
    """One row per run for the runs table."""
    rows = []
    for r in runs:
        rows.append(
            {
                "dir": rel(r.path),
                "dataset": r.dataset,
                "model": r.model,
                "size": r.size,
                "optimizer": r.label,
                "variant": variant_of[r.path].describe(),
                "seed": r.seed,
                "world_size": r.conditions.world_size,
                "machine": r.conditions.machine(),
                "tokens_per_s": r.conditions.tokens_per_s,
                "steps": r.steps,
                "max_steps": r.max_steps,
                "tokens": r.tokens,
                "best_val_loss": r.best_val_loss,
                "status": "finished" if r.finished else "unfinished",
                "downstream": r.downstream.source() if r.downstream else None,
            }
        )
    return rows


def unfinished(runs: list[rr.Run]) -> list[dict[str, Any]]:
    """The unfinished runs (running or interrupted), with how long ago metrics were written."""
    out = []
    for r in runs:
        if r.finished:
            continue
        mtime = (r.path / runfiles.METRICS).stat().st_mtime
        ago = (datetime.datetime.now().timestamp() - mtime) / 60
        when = f"{ago:.0f} min ago" if ago < 120 else f"{ago / 60:.1f} h ago"
        out.append(
            {
                "dir": rel(r.path),
                "steps": r.steps,
                "max_steps": r.max_steps,
                "tokens": r.tokens,
                "last_write": when,
            }
        )
    return out


def downstream_row(variants: list[ana.Variant]) -> dict[str, Any] | None:
    """Seed-mean scores (percent) of the best-ranked variant that has any downstream results."""
    for v in variants:
        runs = [r for r in v.runs if r.downstream is not None]
        if not runs:
            continue
        scores = {}
        for task in et.TASKS:
            values = [r.downstream.scores[task] for r in runs if task in r.downstream.scores]
            if values:
                scores[task] = 100 * statistics.fmean(values)
        sources = sorted({r.downstream.source() for r in runs})
        return {
            "optimizer": v.label,
            "variant": v.describe(),
            "scores": scores,
            "avg": et.paper_average(scores),
            "n_runs": len(runs),
            "source": "; ".join(sources),
            "paper": False,
        }
    return None


def missing_runs(runs: list[rr.Run], published: ana.Published) -> list[dict[str, Any]]:
    """Published (dataset, size, optimizer) cells with no run, for the paper datasets found."""
    have = {(r.dataset, r.size, r.label) for r in runs}
    out = []
    for dataset in sorted({r.dataset for r in runs}, key=lambda d: rr.order_key("dataset", d)):
        cells = published.paper_cells(dataset)
        for size, label in sorted(
            cells, key=lambda c: (rr.order_key("size", c[0]), rr.order_key("label", c[1]))
        ):
            if (dataset, size, label) not in have:
                out.append(
                    {
                        "dataset": dataset,
                        "size": size,
                        "optimizer": label,
                        "tables": cells[(size, label)],
                    }
                )
    return out


def val_loss_sections(
    groups: Groups, at_tokens: list[float] | None, published: ana.Published
) -> list[dict[str, Any]]:
    """One table per dataset: rows optimizer, cells per (token column, size), published tables."""
    sections = []
    for dataset in dict.fromkeys(k[0] for k in groups):
        keys = [k for k in groups if k[0] == dataset]
        longest = max(r.tokens for k in keys for v in groups[k] for r in v.runs)
        columns = ana.token_columns(at_tokens, longest)
        sizes = sorted({k[1] for k in keys}, key=lambda s: rr.order_key("size", s))
        labels = sorted({k[2] for k in keys}, key=lambda lab: rr.order_key("label", lab))
        rows = [
            {
                "optimizer": label,
                "cells": [
                    ana.variant_cell(groups[(dataset, s, label)][0], b, published)
                    for b in columns
                    for s in sizes
                    if (dataset, s, label) in groups
                ],
            }
            for label in labels
        ]
        tables = [
            t
            for t in published.of_kind("val_loss", dataset)
            if any(s in per for per in t["values"].values() for s in sizes)
        ]
        sections.append(
            {
                "dataset": dataset,
                "sizes": sizes,
                "rows": rows,
                "published": tables,
                "columns": [vars(b) for b in columns],
            }
        )
    return sections


def downstream_sections(
    groups: Groups, published: ana.Published, extra_rows: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Per (dataset, size) with results or a published table: our rows, then the paper's."""
    sections = []
    for dataset, size in dict.fromkeys(k[:2] for k in groups):
        rows = [
            row
            for k, vs in groups.items()
            if k[:2] == (dataset, size)
            if (row := downstream_row(vs))
        ]
        pub = published.downstream(dataset, size)
        if not rows and pub is None:
            continue
        for p in (pub or {}).get("rows", []):
            scores = {t: float(p["scores"][t]) for t in et.TASKS if t in p["scores"]}
            rows.append(
                {
                    "optimizer": p.get("paper_name", p["label"]),
                    "label": p["label"],
                    "variant": "",
                    "scores": scores,
                    "avg": p["scores"].get("avg", et.paper_average(scores)),
                    "n_runs": 0,
                    "source": pub["id"],
                    "paper": True,
                }
            )
        sections.append({"dataset": dataset, "size": size, "rows": rows})
    if extra_rows:
        sections.append({"dataset": "other models (lm-eval files)", "size": "", "rows": extra_rows})
    return sections


def extra_lm_rows(files: list[Path], warnings: list[str]) -> list[dict[str, Any]]:
    """Rows for lm-eval files of models that are none of the runs (e.g. OpenAI's GPT-2)."""
    rows = []
    for f in files:
        scores = {t: 100 * v for t, v in rr.lm_eval_scores(f, warnings).items()}
        if scores:
            rows.append(
                {
                    "optimizer": rr.lm_eval_model_path(f) or f.name,
                    "variant": "",
                    "scores": scores,
                    "n_runs": 1,
                    "source": f"lm-eval {rel(f)}",
                    "avg": et.paper_average(scores),
                    "paper": False,
                }
            )
    return rows


def speedup_sections(groups: Groups, baseline: str) -> list[dict[str, Any]]:
    """Per (dataset, size) with an optimizer besides the baseline: ``rspeed.speedup`` or a note."""
    out = []
    for dataset, size in dict.fromkeys(k[:2] for k in groups):
        chosen = {k[2]: vs[0] for k, vs in groups.items() if k[:2] == (dataset, size)}
        if len(chosen) < 2 and baseline in chosen:
            continue
        s = rspeed.speedup_section(chosen, baseline)
        note = f"No {baseline} validation curve for {dataset} {rr.size_name(size)}; no speedup."
        out.append({"dataset": dataset, "size": size, **(s or {"rows": None, "note": note})})
    return out


def figure_series(chosen: list[ana.Variant], title: str, warnings: list[str]) -> tuple[list, list]:
    """The curves of one figure pair: (against tokens, against wall-clock seconds)."""
    tok, timed, untimed = [], [], []
    for v in chosen:
        base = {
            "label": v.label,
            "unfinished": not all(r.finished for r in v.runs),
            "step0": all(r.evals and r.evals[0].step == 0 for r in v.runs),
        }
        if (c := ana.token_curve(v)) is not None:
            tok.append({**base, "n_seeds": len(v.seeds), **c})
        c, left_out = ana.time_curve(v)
        untimed += left_out
        left = {id(r) for r in left_out}
        timed_seeds = {str(r.seed) for r in v.runs if id(r) not in left}
        if c is not None:
            timed.append({**base, "n_seeds": len(timed_seeds), **c})
    if tok and not timed:
        warnings.append(f"time figure {title} not drawn: no run has elapsed_s in its metrics")
    else:
        warnings.extend(
            f"time figure {title}: {rel(r.path)} has no elapsed_s in its metrics; left out"
            for r in untimed
        )
    return tok, timed


def time_caveats(chosen: list[ana.Variant]) -> list[str]:
    """Why the wall-clock figure of ``chosen`` may compare machines rather than optimizers."""
    return rcond.time_caveats(
        [
            (f"{v.label} {r.path.name}", r.model, r.config.get("batch_tokens"), r.conditions)
            for v in chosen
            for r in v.runs
        ]
    )


def figures(groups: Groups, out: Path, warnings: list[str]) -> list[dict[str, Any]]:
    """Two PNGs per (dataset, size): validation loss against tokens and against hours; each
    entry says which points lie above the axis and, for time, why the times may not compare."""
    made = []
    for dataset, size in dict.fromkeys(k[:2] for k in groups):
        chosen = [vs[0] for k, vs in groups.items() if k[:2] == (dataset, size)]
        slug = "_".join(
            "".join(c if c.isalnum() or c in "-." else "-" for c in s.lower())
            for s in (dataset, size)
        )
        title = f"{dataset} {rr.size_name(size)}"
        tok, timed = figure_series(chosen, title, warnings)
        plots = []
        if tok:
            div, xlabel = figs.token_axis(max(float(s["x"].max()) for s in tok))
            plots.append(("tokens", tok, div, xlabel, []))
        if timed:
            div, xlabel = figs.time_axis(max(float(s["x"].max()) for s in timed))
            caveats = time_caveats(chosen)
            warnings.extend(f"time figure {title}: {c}" for c in caveats)
            plots.append(("time", timed, div, xlabel, caveats))
        for kind, series, div, xlabel, caveats in plots:
            name = f"val_loss_{slug}_{kind}.png"
            scaled = [figs.scaled(s, div) for s in series]
            caption = figs.plot_val_loss(scaled, xlabel=xlabel, title=title, path=out / name)
            what = f"{title}: validation loss against {xlabel.split(' (')[0]}"
            made.append(
                {
                    "dataset": dataset,
                    "size": size,
                    "file": name,
                    "what": what,
                    "caption": caption,
                    "caveats": caveats,
                }
            )
    return made


def build_report(
    runs: list[rr.Run],
    *,
    out: Path,
    at_tokens: str,
    baseline: str,
    title: str,
    published_path: Path,
    extra: list[Path],
    warnings: list[str],
) -> dict[str, Any]:
    """Every section of the report as plain data; figures are written into ``out``.

    ``at_tokens`` is the --at-tokens text, ``baseline`` an optimizer name or row label; a bad
    --at-tokens or published file is a ValueError naming it.
    """
    published = ana.Published.load(published_path)
    token_counts = ana.parse_at_tokens(at_tokens)
    groups = ana.group_variants(runs, warnings)
    variant_of = {r.path: v for vs in groups.values() for v in vs for r in v.runs}
    labels = {k[2] for k in groups}
    base = baseline if baseline in labels else rr.optimizer_label({"name": baseline})
    report = {
        "title": title,
        "generated": datetime.datetime.now().isoformat(timespec="seconds"),
        "at_tokens": at_tokens,
        "baseline": base,
        "published_file": rel(published_path),
        "val_loss": val_loss_sections(groups, token_counts, published),
        "variants": variant_rows(groups),
        "downstream": downstream_sections(groups, published, extra_lm_rows(extra, warnings)),
        "speedup": speedup_sections(groups, base),
        "fits": rfits.fit_sections(groups, base, warnings),
        "figures": figures(groups, out, warnings),
        "runs": run_rows(sorted(runs, key=lambda r: rel(r.path)), variant_of),
        "unfinished": unfinished(sorted(runs, key=lambda r: rel(r.path))),
        "missing": missing_runs(runs, published),
        "ablations": abl.ablation_sections(runs, warnings),  # docs/ablations.md
    }
    report["figures"] += rfits.fit_figures(report["fits"], out)
    report["warnings"] = warnings
    return report
