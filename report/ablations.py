"""The ablation table: each row of an ablation set (configs/experiment/ablation/ and
ablation-cpu/, docs/ablations.md) beside the question it answers, compared with the set's MARS
baseline row.

A run belongs to a row by its config's ``name`` (``ablation/gamma0``, ``ablation-cpu/exact``):
the experiment files pin it. Runs of one row whose configs differ only in the seed and
bookkeeping keys are seeds of one entry (their mean, and the sample std as the spread); the lr
grid's runs share a name and are told apart by their lr and lr_1d.

Compute is counted in forward-backward tokens: the training tokens times the passes a step takes,
2 in exact mode (it takes the gradient of the next batch at the current weights as well).
metrics.jsonl's ``tokens`` counts training tokens only, so the report does the counting.
"""

from __future__ import annotations

import json
import statistics
from typing import Any

from analysis.tables import markdown_table as table
from report import runs as rr

SETS = ("ablation", "ablation-cpu")  # the experiment folders, the sets' name prefixes
BASELINE = "mars"
QUESTIONS = {  # row -> the question it answers (in the sets' launch order)
    "mars": "baseline: MARS-AdamW (approx) as the paper runs it",
    "adamw": "for comparison: the paper's AdamW at its own lr, betas and weight decay",
    "gamma0": "is the gain the variance reduction? (MARS#7): gamma = 0, all else MARS's",
    "gamma0-noclip": "is it the hyperparameters? (MARS#7): gamma 0, no clip = AdamW at all of "
    "MARS's values",
    "adamw-mars-hparams": "is it the hyperparameters? (MARS#7): torch AdamW at MARS's lr, betas "
    "and weight decay",
    "lr-grid": "how should lr and lr_1d relate? (MARS#8)",
    "optimize-1d": "what does optimize_1d do? (MARS#4): 1-D tensors on MARS instead of AdamW",
    "exact": "exact vs approx per step (exact: two gradients a step)",
    "exact-half": "exact vs approx at equal compute (exact for half the steps)",
    "clip-global": "does the clip scope matter? global instead of per-tensor",
    "first-plain": "does the first step matter? c_1 = g_1 instead of g_ref = 0",
}


def row_of(run: rr.Run) -> tuple[str, str] | None:
    """(set, row) of an ablation run, from its config's name; None for other runs."""
    prefix, _, row = str(run.config.get("name", "")).partition("/")
    return (prefix, row) if prefix in SETS and row in QUESTIONS else None


def passes_per_step(run: rr.Run) -> int:
    """Forward-backward passes per optimizer step: 2 in exact mode, else 1."""
    return 2 if (run.config.get("optimizer") or {}).get("mode") == "exact" else 1


def compute(run: rr.Run) -> float:
    """The run's forward-backward tokens (training tokens times passes per step)."""
    return run.tokens * passes_per_step(run)


def best_within_compute(run: rr.Run, limit: float | None) -> float | None:
    """Best trained validation loss at or below ``limit`` forward-backward tokens."""
    tokens = None if limit is None else limit / passes_per_step(run)
    return run.best_within(tokens)


def final_loss(run: rr.Run) -> float | None:
    """The last trained evaluation's loss (the step-0 one never counts)."""
    evals = run.trained_evals(None)
    return evals[-1].loss if evals else None


def changed(items: dict[str, Any], base: dict[str, Any] | None) -> str:
    """The config values where ``items`` differs from the baseline's, as ``key=value`` text.
    Under another optimizer only the keys both have count (the rest belong to one of them)."""
    if base is None:
        return ""
    same = items.get("optimizer.name") == base.get("optimizer.name")
    keys = [k for k in items if (same or k in base) and items[k] != base.get(k)]
    return ", ".join(f"{k.removeprefix('optimizer.')}={items[k]}" for k in keys)


def _mean_std(values: list[float | None]) -> tuple[float | None, float | None]:
    got = [v for v in values if v is not None]
    if not got:
        return None, None
    return statistics.fmean(got), statistics.stdev(got) if len(got) > 1 else None


def _entries(runs: list[rr.Run]) -> dict[tuple[str, str, str], list[rr.Run]]:
    """Runs grouped as (set, row, variant) entries: seeds of one configuration together."""
    out: dict[tuple[str, str, str], list[rr.Run]] = {}
    for run in runs:
        if (key := row_of(run)) is not None:
            variant = json.dumps(run.variant_items, sort_keys=True, default=str)
            out.setdefault((*key, variant), []).append(run)
    return out


def _label(row: str, first: rr.Run) -> str:
    if row != "lr-grid":
        return row
    opt = first.config.get("optimizer") or {}
    return f"lr-grid lr={opt.get('lr'):g} lr_1d={opt.get('lr_1d'):g}"


def _sort_key(row: dict[str, Any]) -> tuple:
    opt = row["optimizer"]
    grid = (opt.get("lr") or 0, opt.get("lr_1d") or 0) if row["row"] == "lr-grid" else (0, 0)
    return (list(QUESTIONS).index(row["row"]), *grid, row["label"])


def entry_row(row: str, runs: list[rr.Run], base: dict[str, Any] | None) -> dict[str, Any]:
    """One table row from the runs (seeds) of one entry; ``base`` is the baseline's row."""
    best, best_std = _mean_std([r.best_val_loss for r in runs])
    final, final_std = _mean_std([final_loss(r) for r in runs])
    base_compute = base["compute"] if base else None
    at_equal, _ = _mean_std([best_within_compute(r, base_compute) for r in runs])
    items = runs[0].variant_items
    out = {
        "row": row,
        "label": _label(row, runs[0]),
        "question": QUESTIONS[row],
        "optimizer": runs[0].config.get("optimizer") or {},
        "changed": changed(items, base["items"] if base else None),
        "items": items,
        "runs": [str(r.path) for r in runs],
        "seeds": sorted({str(r.seed) for r in runs}),
        "n_runs": len(runs),
        "finished": all(r.finished for r in runs),
        "steps": max(r.steps for r in runs),
        "passes_per_step": passes_per_step(runs[0]),
        "compute": statistics.fmean(compute(r) for r in runs),
        "best": best,
        "best_std": best_std,
        "final": final,
        "final_std": final_std,
        "best_at_base_compute": at_equal,
    }
    base_best = base["best"] if base else None
    out["delta_best"] = None if best is None or base_best is None else best - base_best
    return out


def ablation_sections(runs: list[rr.Run], warnings: list[str]) -> list[dict[str, Any]]:
    """One section per ablation set found among ``runs``: its rows, baseline first."""
    entries = _entries(runs)
    sections = []
    for set_name in SETS:
        mine = {k: v for k, v in entries.items() if k[0] == set_name}
        if not mine:
            continue
        bases = [k for k in mine if k[1] == BASELINE]
        if len(bases) > 1:
            warnings.append(f"ablation set {set_name}: {len(bases)} differing `{BASELINE}` "
                            "configurations; the first found is the baseline")  # fmt: skip
        base = entry_row(BASELINE, mine[bases[0]], None) if bases else None
        if base is None:
            warnings.append(f"ablation set {set_name}: no `{BASELINE}` run, so no differences "
                            f"to the baseline (run it: --only '{set_name}/{BASELINE}')")  # fmt: skip
        rows = [entry_row(k[1], v, base) for k, v in mine.items() if not bases or k != bases[0]]
        if base is not None:
            base["changed"], base["delta_best"] = "", 0.0
            rows.insert(0, base)
        rows = sorted(rows, key=_sort_key)
        sections.append({"set": set_name, "baseline": BASELINE if base else None, "rows": rows})
    return sections


def _num(value: float | None, std: float | None = None, sign: bool = False) -> str:
    if value is None:
        return "–"
    text = f"{value:+.3f}" if sign else f"{value:.3f}"
    return text + (f" ± {std:.3f}" if std is not None else "")


def _tokens(value: float) -> str:
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if value >= div:
            return f"{value / div:.3g}{unit}"
    return f"{value:.0f}"


def render_ablations(sections: list[dict[str, Any]]) -> str:
    """The ablation tables as markdown (empty when there is no ablation run)."""
    if not sections:
        return ""
    headers = ["question", "row", "changed", "seeds", "steps", "fwd-bwd tokens", "best val",
               "final val", "Δ best vs mars", "best at mars's compute"]  # fmt: skip
    out = ["## Ablations", ""]
    for sec in sections:
        lines = [
            [r["question"], r["label"] + ("" if r["finished"] else " *"), r["changed"] or "–",
             f"{r['n_runs']} ({', '.join(r['seeds'])})", str(r["steps"]), _tokens(r["compute"]),
             _num(r["best"], r["best_std"]), _num(r["final"], r["final_std"]),
             _num(r["delta_best"], sign=True), _num(r["best_at_base_compute"])]
            for r in sec["rows"]
        ]  # fmt: skip
        out += [f"### {sec['set']}", "", table(headers, lines), ""]
    out += [
        "- best val: the lowest validation loss after step 0; final val: the last one. With "
        "several seeds, the mean ± the sample std over the runs. `*` the run is unfinished.",
        "- Δ best vs mars: the row's best minus the `mars` row's (negative: better than MARS).",
        "- fwd-bwd tokens: training tokens x forward-backward passes per step (2 in exact mode; "
        "metrics.jsonl's `tokens` counts training tokens only). best at mars's compute: the best "
        "loss among evaluations within the `mars` row's fwd-bwd tokens: the per-FLOP comparison.",
        "- changed: the config values that differ from the `mars` row's (under another "
        "optimizer, of the keys both have).",
    ]
    return "\n".join(out) + "\n"


def with_ablations(text: str, sections: list[dict[str, Any]]) -> str:
    """The report's markdown with the ablation section before its Runs section (or at the end)."""
    section = render_ablations(sections)
    if not section:
        return text
    marker = "\n## Runs\n"
    at = text.find(marker)
    return text + "\n" + section if at < 0 else text[: at + 1] + section + text[at:]
