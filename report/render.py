"""Markdown of ``python -m report``: every section is rendered from the report dictionary (the
same data as report.json), so the two never disagree."""

from __future__ import annotations

from typing import Any

from analysis.tables import markdown_table as table
from evals import tasks as et
from report.fits import fit_tables
from report.fits import method_note as fits_note
from report.runs import order_key, size_name
from report.time_to_loss import method_note, speedup_table
from report.variants import EVAL_GAP, PAPER_COLUMNS, format_tokens

NOT_REACHED = "*"
EARLY = "†"


def fmt(value: float | None, digits: int = 3) -> str:
    """A number with ``digits`` decimals, or ``–`` for none."""
    return "–" if value is None else f"{value:.{digits}f}"


def cell_text(cell: dict[str, Any] | None) -> str:
    """``3.110 ± 0.004* (paper 3.108, +0.002)``; empty when there is no run for the cell."""
    if cell is None:
        return ""
    text = fmt(cell["mean"])
    if cell["std"] is not None:
        text += f" ± {cell['std']:.3f}"
    if cell["mean"] is not None and not cell["reached"]:
        text += NOT_REACHED
    elif cell["mean"] is not None and cell.get("early"):
        text += EARLY
    if cell["paper"] is not None:
        approx = "≈" if cell["paper_approximate"] else ""
        diff = f", {cell['diff']:+.3f}" if cell["diff"] is not None else ""
        text += f" (paper {approx}{cell['paper']:.3f}{diff})"
    return text


def render_val_loss(section: dict[str, Any]) -> str:
    """One dataset's table: rows optimizer, columns tokens x size (the paper's layout)."""
    sizes = section["sizes"]
    # a token column before every run's first evaluation after step 0 has no value: left out
    valued = {c["column"] for r in section["rows"] for c in r["cells"] if c["mean"] is not None}
    columns = [b for b in section["columns"] if b["label"] in valued]
    dropped = [b["label"] for b in section["columns"] if b["label"] not in valued]
    headers = ["optimizer"] + [f"{size_name(s)} {b['label']}" for b in columns for s in sizes]
    rows = []
    for row in section["rows"]:
        by_key = {(c["column"], c["size"]): c for c in row["cells"]}
        rows.append(
            [row["optimizer"]]
            + [cell_text(by_key.get((b["label"], s))) for b in columns for s in sizes]
        )
    whole = [b["label"] for b in columns if b["tokens"] is None]
    notes = [
        "Best (lowest) validation loss among the evaluations at or below each column's token "
        "count; the mean over seeds, ± the sample standard deviation when there are several.",
        f"`{NOT_REACHED}` not reached yet: the run has not trained through that many tokens (it "
        "is unfinished or shorter); the value is its best so far. `–`: no evaluation after step "
        "0 at or below them (the step-0 loss, of the untrained model, is never a column's).",
    ]
    if dropped:
        notes.append(
            f"Left out: {', '.join(dropped)}, columns that come before the first evaluation of "
            "every run (evaluate earlier, `eval_every`, to fill them)."
        )
    if any(c.get("early") for r in section["rows"] for c in r["cells"]):
        notes.append(
            f"`{EARLY}` the last evaluation at or below the column's tokens is more than "
            f"{EVAL_GAP:.0%} of them before them: the value is the loss then, not at the "
            "column's tokens (evaluate more often to fill the column)."
        )
    if whole:
        paper = (
            "; the paper's 50B is 100k steps of 491,520 tokens = 49.15B" if whole == ["50B"] else ""
        )
        notes.append(f"{whole[0]} = the whole run (all evaluations){paper}.")
    if any(c["paper"] is not None for r in section["rows"] for c in r["cells"]):
        notes.append(
            "(paper X, ±d): the published value and ours minus it; ≈ marks a value read off a plot."
        )
    return table(headers, rows) + "\n\n" + "\n".join(f"- {n}" for n in notes)


def render_published(t: dict[str, Any]) -> str:
    """A published val-loss table as printed in its source (the tokens x size layout)."""
    values = t["values"]
    sizes = sorted({s for per in values.values() for s in per}, key=lambda s: order_key("size", s))
    columns = [
        b
        for b in PAPER_COLUMNS
        if any(b in (per.get(s) or {}) for per in values.values() for s in sizes)
    ]
    headers = ["optimizer"] + [f"{size_name(s)} {b}" for b in columns for s in sizes]
    approx = "≈" if t.get("approximate") else ""
    rows = [
        [label]
        + [
            f"{approx}{v:.3f}" if (v := (per.get(s) or {}).get(b)) is not None else "–"
            for b in columns
            for s in sizes
        ]
        for label, per in values.items()
    ]
    return f"**{t['title']}**, from {t['source']}\n\n" + table(headers, rows)


def downstream_note() -> str:
    """How the downstream table is made, from the task metadata of ``evals/tasks.py``."""

    def columns(names: list[str]) -> str:
        return ", ".join(et.TASKS[t].column for t in names)

    averaged = et.paper_average_tasks()
    others = [t for t in et.TASKS if t not in averaged]
    by_metric = {m: [t for t in et.TASKS if et.TASKS[t].metric == m] for m in ("acc_norm", "acc")}
    text = (
        f"Zero-shot accuracy in percent: acc_norm for {columns(by_metric['acc_norm'])}; acc for "
        f"{columns(by_metric['acc'])}. Avg is the paper's: the unweighted mean of its "
        f"{len(averaged)} tasks ({columns(averaged)}), only when all of them exist"
    )
    text += f"; {columns(others)} are shown but not averaged. " if others else ". "
    return text + (
        "lm-eval results win over eval.py's where a run has both; eval.py scores some tasks on "
        "validation splits where the paper used test splits."
    )


def render_downstream(section: dict[str, Any]) -> str:
    """One (dataset, size): our rows, then the published rows marked (paper)."""
    headers = ["optimizer", *(t.column for t in et.TASKS.values()), "Avg", "source"]
    rows = []
    for row in section["rows"]:
        name = row["optimizer"] + (" (paper)" if row["paper"] else "")
        scores = [fmt(row["scores"].get(t), 2) for t in et.TASKS]
        rows.append([name, *scores, fmt(row["avg"], 2), row["source"]])
    return table(headers, rows) + "\n\n- " + downstream_note()


def render_speedup(s: dict[str, Any]) -> str:
    """One (dataset, size): the baseline's L*, then per optimizer both speedups (time_to_loss.py)."""
    head, headers, rows = speedup_table(s)
    return head + "\n\n" + table(headers, rows)


def render_fits(section: dict[str, Any]) -> str:
    """One dataset's loss fits and effective speedups (fits.py)."""
    parts = [table(headers, rows) for headers, rows in fit_tables(section)]
    parts += [f"- {section['note']}"] if section["note"] else []
    return "\n\n".join(parts + [f"- {fits_note(section['baseline'])}"])


def render_variants(variants: list[dict[str, Any]]) -> str:
    """Every variant with its differing keys, seeds and best loss; the chosen marked."""
    rows = []
    for v in variants:
        best = fmt(v["best_mean"]) + (f" ± {v['best_std']:.3f}" if v["best_std"] else "")
        rows.append(
            [
                v["dataset"],
                size_name(v["size"]),
                v["optimizer"],
                v["variant"],
                ", ".join(map(str, v["seeds"])),
                best,
                "chosen" if v["chosen"] else "",
            ]
        )
    headers = ["dataset", "size", "optimizer", "variant", "seeds", "best val loss", ""]
    return table(headers, rows) + (
        "\n\n- A variant: runs whose configs differ only in the seed and bookkeeping keys. "
        "The cells, figures and speedups use the chosen (lowest mean best loss) variant."
    )


def render_runs(runs: list[dict[str, Any]]) -> str:
    """Every run found."""
    headers = [
        "run",
        "dataset",
        "model",
        "optimizer",
        "variant",
        "seed",
        "procs",
        "tok/s",
        "steps",
        "tokens",
        "best val loss",
        "status",
    ]
    rows = [
        [
            r["dir"],
            r["dataset"],
            r["model"],
            r["optimizer"],
            r["variant"],
            r["seed"],
            r.get("world_size") or "?",
            "–" if r.get("tokens_per_s") is None else f"{r['tokens_per_s']:,.0f}",
            f"{r['steps']}/{r['max_steps']}",
            format_tokens(r["tokens"]),
            fmt(r["best_val_loss"]),
            r["status"],
        ]
        for r in runs
    ]
    return table(headers, rows)


def render_status(report: dict[str, Any]) -> str:
    """The unfinished runs and the published runs that have no run here."""
    out = ["### Unfinished runs", ""]
    out += [
        f"- {u['dir']}: {u['steps']}/{u['max_steps']} steps, "
        f"{format_tokens(u['tokens'])} tokens, last metrics write {u['last_write']}"
        for u in report["unfinished"]
    ] or ["None."]
    out += ["", "### Published runs missing", ""]
    out += [
        f"- {m['dataset']} {size_name(m['size'])} {m['optimizer']} (in {', '.join(m['tables'])})"
        for m in report["missing"]
    ] or ["None."]
    return "\n".join(out)


def render_figure(f: dict[str, Any]) -> str:
    """One figure's line: file, what it shows, the points above its axis, its caveats."""
    text = f"- `{f['file']}`: {f['what']}" + (f"; {f['caption']}" if f.get("caption") else "")
    for caveat in f.get("caveats") or []:
        text += f"\n  - **Caution, the times may not compare:** {caveat}."
    return text


def render(report: dict[str, Any]) -> str:
    """The whole report as markdown."""
    runs = report["runs"]
    done = sum(r["status"] == "finished" for r in runs)
    out = [
        f"# {report['title']}",
        "",
        f"{len(runs)} runs ({done} finished, {len(runs) - done} unfinished); "
        f"generated {report['generated']}; token columns {report['at_tokens']}; "
        f"published values from {report['published_file']}.",
    ]
    for section in report["val_loss"]:
        out += ["", f"## Validation loss: {section['dataset']}", "", render_val_loss(section)]
        for t in section["published"]:
            out += ["", render_published(t)]
    if report["variants"]:
        out += ["", "## Variants", "", render_variants(report["variants"])]
    for section in report["downstream"]:
        out += [
            "",
            f"## Downstream: {section['dataset']} {size_name(section['size'])}".rstrip(),
            "",
            render_downstream(section),
        ]
    if report["speedup"]:
        out += [
            "",
            f"## Speedup over {report['baseline']}",
            "",
            method_note(report["baseline"]),
        ]
        for s in report["speedup"]:
            out += ["", f"### {s['dataset']} {size_name(s['size'])}", ""]
            out += [render_speedup(s) if s.get("rows") is not None else s["note"]]
    for section in report.get("fits", []):
        out += ["", f"## Loss against compute: {section['dataset']}", "", render_fits(section)]
    if report["figures"]:
        out += ["", "## Figures", ""] + [render_figure(f) for f in report["figures"]]
    out += ["", "## Runs", "", render_runs(runs), "", render_status(report)]
    if report["warnings"]:
        out += ["", "## Warnings", ""] + [f"- {w}" for w in report["warnings"]]
    return "\n".join(out) + "\n"
