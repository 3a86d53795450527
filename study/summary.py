"""The study's results in one table and one figure, made from the committed ledgers alone:
every cell (proxy, budget, batch), AdamW's loss, every optimizer's gap to AdamW with its paired
90% t-interval, and the Muon family's data-equivalent speedups (docs/study.md, "Statistics").

    python -m study summary [--results results] [--readme README.md]

Writes RESULTS/summary.md and RESULTS/summary.png, and with ``--readme`` puts the table into the
README between its ``<!-- results table -->`` marks (a test checks that the README's table is
this command's output, so it cannot be typed by hand or go stale).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

from analysis.speedup import data_equivalent_speedup
from analysis.stats import LEVEL, paired_interval
from study.figures import colour_of
from study.results import read_csv
from study.tables import BASELINE, eval_losses

ROOT = Path(__file__).resolve().parent.parent
OPTIMIZERS = ["mars-adamw", "muon", "mars-m", "moonlight"]  # the columns, beside AdamW's loss
MUON_FAMILY = {"muon", "mars-m", "moonlight"}
BEGIN, END = "<!-- results table: python -m study summary --readme README.md -->", "<!-- end -->"


@dataclass(frozen=True)
class Part:
    path: str  # the ledger, relative to the results folder
    note: str  # what sets the cell apart


PARTS = [
    Part("referee/headline/results.csv", ""),
    Part("referee/ladder/results.csv", ""),
    Part("referee/ladder-up/results.csv", ""),
    Part("referee/widthinit/results.csv", "width-aware init"),
    Part("referee/batch/results.csv", "both tuned anew"),
    # the headline's cell again: MARS-AdamW's lr tuned, its other knobs the batch part's
    Part("crossover/b2048/results.csv", "lr tuned, other knobs from 8,192 B"),
]


@dataclass
class Cell:
    label: str
    adamw: float
    gaps: dict  # optimizer -> Interval
    speedups: dict  # optimizer -> str


def cells_of(rows: list[dict], note: str) -> list[Cell]:
    """The cells of one ledger where AdamW and another optimizer ran the evaluation seeds."""
    losses = eval_losses(rows)
    tokens = {(r["model"], r["budget"]): r["tokens"] for r in rows if r["role"] == "eval"}
    batch = {(r["model"], r["budget"]): r["batch_tokens"] for r in rows if r["role"] == "eval"}
    out = []
    for model, budget in sorted({(m, b) for (_o, m, b) in losses}):
        ref = losses.get((BASELINE, model, budget))
        others = {o: s for (o, m, b), s in losses.items() if (m, b) == (model, budget)
                  and o in OPTIMIZERS}  # fmt: skip
        if not ref or not others:
            continue
        curve = {tokens[(model, b)]: s for (o, m, b), s in losses.items()
                 if o == BASELINE and m == model and (model, b) in tokens}  # fmt: skip
        cell = Cell(f"{model}, {budget:g}x, {batch[(model, budget)]:,.0f} B"
                    + (f", {note}" if note else ""),
                    sum(ref.values()) / len(ref), {}, {})  # fmt: skip
        for opt, seeds in others.items():
            cell.gaps[opt] = paired_interval(ref, seeds)
            if opt in MUON_FAMILY and len(curve) > 1:
                try:
                    sp = data_equivalent_speedup(curve, seeds, tokens[(model, budget)])
                    cell.speedups[opt] = f"{sp.point} [{sp.lo}, {sp.hi}]"
                except ValueError:
                    pass
        out.append(cell)
    return out


def all_cells(results: Path) -> list[Cell]:
    cells = []
    for part in PARTS:
        if (results / part.path).is_file():
            own = [
                r
                for r in read_csv(results / part.path)
                if str(r.get("run_dir", "")).startswith("runs/")
            ]  # merged cells: their own part
            cells += cells_of(own, part.note)
    return cells


def markdown(cells: list[Cell]) -> str:
    pct = f"{LEVEL:.0%}"
    head = ["cell (proxy, budget, batch)", "AdamW loss"] + [
        f"{o} minus AdamW [{pct}]" for o in OPTIMIZERS
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cells:
        row = [c.label, f"{c.adamw:.3f}"]
        for o in OPTIMIZERS:
            g = c.gaps.get(o)
            if g is None:
                row.append("-")
                continue
            text = f"{g.mean:+.3f} [{g.lo:+.3f}, {g.hi:+.3f}]"
            if o in c.speedups:
                text += f"; {c.speedups[o]}"
            row.append(text)
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def figure(cells: list[Cell], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.2))
    width = 0.8 / len(OPTIMIZERS)
    for k, opt in enumerate(OPTIMIZERS):
        xs, ys, lo, hi = [], [], [], []
        for i, c in enumerate(cells):
            g = c.gaps.get(opt)
            if g is not None and math.isfinite(g.mean):
                xs.append(i + (k - (len(OPTIMIZERS) - 1) / 2) * width)
                ys.append(g.mean)
                lo.append(g.mean - g.lo)
                hi.append(g.hi - g.mean)
        if xs:
            ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", color=colour_of(opt), label=opt,
                        capsize=2)  # fmt: skip
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(range(len(cells)))
    ax.set_xticklabels([c.label.replace(", ", "\n", 1) for c in cells], fontsize=7)
    ax.set_ylabel(f"final val loss minus AdamW's ({LEVEL:.0%} paired t)")
    ax.set_title("below 0: better than AdamW in the same cell", fontsize=9)
    ax.legend(fontsize=8, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def put_in_readme(readme: Path, table: str) -> None:
    text = readme.read_text()
    if BEGIN not in text or END not in text.split(BEGIN, 1)[1]:
        raise SystemExit(f"study.summary: {readme} has no '{BEGIN}' ... '{END}' block to fill")
    before, rest = text.split(BEGIN, 1)
    after = rest.split(END, 1)[1]
    readme.write_text(f"{before}{BEGIN}\n{table}{END}{after}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m study summary", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--results", type=Path, default=ROOT / "results")
    ap.add_argument("--readme", type=Path, default=None)
    args = ap.parse_args(argv)
    cells = all_cells(args.results)
    if not cells:
        raise SystemExit(f"study.summary: no ledger with a comparison under {args.results}")
    table = markdown(cells)
    (args.results / "summary.md").write_text(table)
    figure(cells, args.results / "summary.png")
    if args.readme:
        put_in_readme(args.readme, table)
    print(table, end="")
    return 0
