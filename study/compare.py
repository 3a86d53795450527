"""Does a ranking hold across cells? ``python -m study cells`` reads the results.csv of finished
studies (or parts of one) and puts their comparison cells side by side: sizes of the ladder,
default against width-aware initialisation, one budget against another.

    python -m study cells default=runs/referee-ladder/results.csv \\
        width-aware=runs/referee-widthinit/results.csv --out compare.md --figure compare.png
    python -m study cells ladder=runs/referee-ladder-up/results.csv     # every size of one file

A source is ``LABEL=PATH`` (every comparison cell of the file: a (model, budget) where two
optimizers or more have evaluation runs at their chosen values) or ``LABEL=PATH@MODEL:BUDGET``
(that cell only). The markdown (docs/study.md, "Across cells") has, per cell, every optimizer's
gap to AdamW with its paired t-interval, its collapses and the ranking; per pair of optimizers,
whether their order is the same in every cell and holds there after Holm's correction (over every
pair of every cell compared: one family); and per optimizer, how its gap to AdamW changes between
cells: the per-seed difference to the first cell, and with three cells or more of different sizes
(or budgets) the per-seed least-squares slope of the gap against log2 N (or log2 tokens), each with
its t-interval over the evaluation seeds, Holm over the optimizers.

The cells' gaps pair by seed (a seed fixes the data order in every cell, and the initial draws
where the shapes agree); the intervals stay valid where the cells share less.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

import numpy as np

from analysis.stats import LEVEL, holm, mean_interval, paired_interval, paired_p_value
from study.knobs import KNOB_ORDER
from study.results import read_csv
from study.tables import BASELINE, BASELINE_ROW, eval_losses

ALPHA = 1 - LEVEL  # a difference holds after correction at Holm p <= ALPHA


@dataclass
class Cell:
    """One comparison cell: its label, shape and the chosen evaluation losses per optimizer."""

    label: str
    model: str
    budget: float
    params: float
    tokens: float
    batch: float
    losses: dict[str, dict[int, float]] = field(default_factory=dict)  # {opt: {seed: loss}}
    collapsed: dict[str, int] = field(default_factory=dict)
    chosen: dict[str, dict[str, float]] = field(default_factory=dict)  # {opt: {knob: value}}


def parse_source(text: str) -> tuple[str, Path, tuple[str, float] | None]:
    """``LABEL=PATH[@MODEL:BUDGET]`` -> (label, path, cell or None)."""
    label, sep, rest = text.partition("=")
    if not sep or not label or not rest:
        raise ValueError(f"a source is LABEL=PATH[@MODEL:BUDGET], got {text!r}")
    path, at, cell = rest.partition("@")
    if not at:
        return label, Path(path), None
    model, colon, budget = cell.partition(":")
    try:
        return label, Path(path), (model, float(budget.rstrip("x")))
    except ValueError:
        raise ValueError(f"{text!r}: the cell is MODEL:BUDGET, e.g. proxy-100k:0.25") from None


def cells_of(label: str, rows: list[dict], only: tuple[str, float] | None = None) -> list[Cell]:
    """The comparison cells of one results.csv's rows (two optimizers or more evaluated at their
    chosen values), smallest model first; ``only``: that (model, budget)."""
    losses = eval_losses(rows)
    found: dict[tuple[str, float], list[str]] = {}
    for opt, model, budget in losses:
        found.setdefault((model, budget), []).append(opt)
    keys = [k for k, opts in found.items() if len(opts) >= 2]
    if only is not None:
        keys = [k for k in keys if k[0] == only[0] and math.isclose(k[1], only[1])]
        if not keys:
            have = ", ".join(f"{m}:{b:g} ({len(found[m, b])} evaluated)" for m, b in sorted(found))
            raise ValueError(f"{label}: no comparison cell {only[0]}:{only[1]:g}: a cell needs "
                             f"two optimizers evaluated (cells: {have or 'none'})")  # fmt: skip
    first = {}
    for r in rows:
        if r["role"] == "eval":
            first.setdefault((r["model"], r["budget"]), r)
    out = []
    for model, budget in sorted(keys, key=lambda k: (first[k]["non_embedding_params"], k[1])):
        r = first[(model, budget)]
        name = label if only is not None or len(keys) == 1 else f"{label} {model} {budget:g}x"
        cell = Cell(name, model, budget, r["non_embedding_params"], r["tokens"], r["batch_tokens"])
        for opt in sorted(found[(model, budget)]):
            cell.losses[opt] = losses[(opt, model, budget)]
            cell.collapsed[opt] = sum(
                int(x.get("collapsed") or 0)
                for x in rows
                if x["role"] == "eval" and x.get("chosen", 1.0) == 1.0
                and (x["optimizer"], x["model"], x["budget"]) == (opt, model, budget)
            )  # fmt: skip
            pick = next(x for x in rows if x["role"] == "eval" and x.get("chosen", 1.0) == 1.0
                        and (x["optimizer"], x["model"], x["budget"]) == (opt, model, budget))  # fmt: skip
            cell.chosen[opt] = {k: pick[k] for k in KNOB_ORDER if isinstance(pick.get(k), float)}
        out.append(cell)
    return out


def pair_tests(cells: list[Cell]) -> dict[tuple[int, str, str], dict]:
    """Every pair (a < b by name) of every cell: ``b - a``'s interval, p and Holm p, Holm over
    all of them (one family)."""
    tests: dict[tuple[int, str, str], dict] = {}
    for i, c in enumerate(cells):
        for a, b in combinations(sorted(c.losses), 2):
            A, B = c.losses[a], c.losses[b]
            if len(set(A) & set(B)) < 2:
                continue
            tests[(i, a, b)] = {"gap": paired_interval(A, B), "p": paired_p_value(A, B)}
    for t, adj in zip(tests.values(), holm([t["p"] for t in tests.values()])):
        t["p_holm"] = adj
    return tests


def _gap(tests: dict, i: int, a: str, b: str) -> tuple[float, dict] | None:
    """(sign flip, test) of ``b - a`` in cell i, whichever order the test was stored in."""
    if (i, a, b) in tests:
        return 1.0, tests[(i, a, b)]
    if (i, b, a) in tests:
        return -1.0, tests[(i, b, a)]
    return None


def ranking(cell: Cell, i: int, tests: dict) -> str:
    """The optimizers by mean loss, best first; ``<`` where the neighbours differ after Holm,
    ``~`` where the seeds cannot tell them apart."""
    order = sorted(cell.losses, key=lambda o: float(np.mean(list(cell.losses[o].values()))))
    text = order[0]
    for a, b in zip(order, order[1:]):
        g = _gap(tests, i, a, b)
        text += f" {'<' if g and g[1]['p_holm'] <= ALPHA else '~'} {b}"
    return text


def pair_verdict(cells: list[Cell], tests: dict, a: str, b: str) -> tuple[list[str], str]:
    """Per cell ``b - a`` (interval, Holm p), and whether their order holds across the cells."""
    shown, signs, held = [], [], []
    for i, _ in enumerate(cells):
        g = _gap(tests, i, a, b)
        if g is None:
            shown.append("-")
            continue
        s, t = g
        gap = t["gap"]
        lo, hi = sorted((s * gap.lo, s * gap.hi))
        holds = t["p_holm"] <= ALPHA
        shown.append(f"{s * gap.mean:+.3f} [{lo:+.3f}, {hi:+.3f}]{'' if holds else ' (n.s.)'}")
        signs.append(np.sign(s * gap.mean))
        held.append(holds)
    n = len(signs)
    if n < 2:
        return shown, "in one cell only"
    firm = {sg for sg, h in zip(signs, held) if h}
    if len(firm) > 1:
        return shown, "**order flips** (each direction holds after Holm in some cell)"
    if all(held):
        first = "lower" if signs[0] < 0 else "higher"
        return shown, f"same order in all {n} cells, holds in all ({b} {first})"
    if firm:
        side = "lower" if firm.pop() < 0 else "higher"
        return shown, (
            f"{b} {side} where told apart ({sum(held)} of {n} cells); "
            f"the seeds cannot tell them apart in the rest"
        )
    return shown, f"told apart in none of the {n} cells"


def _axis(cells: list[Cell]) -> tuple[str, list[float]] | None:
    """The cells' size axis when every cell differs in it: log2 N, else log2 tokens."""
    for name, values in (("N", [c.params for c in cells]), ("tokens", [c.tokens for c in cells])):
        if len(set(values)) == len(cells) >= 2 and all(v > 0 for v in values):
            return name, [math.log2(v) for v in values]
    return None


def gap_changes(cells: list[Cell]) -> tuple[list[str], list[str]]:
    """Per optimizer with AdamW in every cell: its per-seed gap to AdamW in each later cell minus
    in the first, and (three cells or more on a size axis) the per-seed slope of the gap against
    log2 of the axis; t-intervals over the seeds every cell shares, Holm over the optimizers."""
    opts = sorted(set.intersection(*(set(c.losses) for c in cells)) - {BASELINE})
    if len(cells) < 2 or not all(BASELINE in c.losses for c in cells) or not opts:
        return [], []
    axis = _axis(cells)
    slope_on = axis is not None and len(cells) >= 3
    head = ["optimizer"] + [f"{c.label} - {cells[0].label}" for c in cells[1:]]
    if slope_on:
        head.append(f"slope per doubling of {axis[0]}")
    lines = ["| " + " | ".join(head + ["Holm p (of the last column)"]) + " |",
             "|" + "---|" * (len(head) + 1)]  # fmt: skip
    ps, rows = [], []
    for opt in opts:
        seeds = sorted(set.intersection(*(set(c.losses[opt]) & set(c.losses[BASELINE])
                                          for c in cells)))  # fmt: skip
        if len(seeds) < 2:
            continue
        g = np.array([[c.losses[opt][s] - c.losses[BASELINE][s] for s in seeds] for c in cells])
        cols = []
        for j in range(1, len(cells)):
            iv = mean_interval(g[j] - g[0])
            cols.append(f"{iv.mean:+.3f} [{iv.lo:+.3f}, {iv.hi:+.3f}]")
        last = g[-1] - g[0]
        if slope_on:
            x = np.array(axis[1]) - np.mean(axis[1])
            last = (x @ (g - g.mean(axis=0))) / (x @ x)  # per-seed least-squares slopes
            iv = mean_interval(last)
            cols.append(f"{iv.mean:+.3f} [{iv.lo:+.3f}, {iv.hi:+.3f}]")
        ps.append(
            paired_p_value(dict.fromkeys(range(len(last)), 0.0), dict(enumerate(last)))
        )  # H0: 0
        rows.append((opt, cols))
    for (opt, cols), p in zip(rows, holm(ps)):
        lines.append(f"| {opt} | " + " | ".join(cols) + f" | {p:.3g} |")
    notes = [f"Seeds shared by every cell: paired per seed. Gap: optimizer minus AdamW, in nats; a "
             f"negative change: the optimizer gains on AdamW from {cells[0].label} to the other cell."]  # fmt: skip
    if slope_on:
        notes.append(f"Slope: the per-seed least-squares slope of the gap against log2 {axis[0]} "
                     f"({', '.join(f'{c.label}: {2 ** v:,.0f}' for c, v in zip(cells, axis[1]))}).")  # fmt: skip
    return lines, notes


def missing_note(cells: list[Cell]) -> list[str]:
    """A line naming the optimizers some cells lack (an unfinished part, or one that ran fewer)."""
    every = sorted({o for c in cells for o in c.losses})
    gaps = [f"{o} (not in {', '.join(c.label for c in cells if o not in c.losses)})"
            for o in every if any(o not in c.losses for c in cells)]  # fmt: skip
    if not gaps:
        return []
    return [f"**Not in every cell:** {'; '.join(gaps)}. Their pairs read in the cells that have "
            "them; a part still running adds them when its report is published again.", ""]  # fmt: skip


def render(cells: list[Cell], sources: list[str]) -> str:
    tests = pair_tests(cells)
    pct = f"{LEVEL:.0%}"
    opts = sorted({o for c in cells for o in c.losses}, key=lambda o: (o != BASELINE, o))
    setup = ["| cell | model | N (block params) | budget | tokens | batch | optimizers (eval seeds) |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for c in cells:
        seeds = sorted({s for v in c.losses.values() for s in v})
        setup.append(f"| {c.label} | {c.model} | {c.params:,.0f} | {c.budget:g}x | {c.tokens:,.0f} | "
                     f"{c.batch:,.0f} | {len(c.losses)} ({', '.join(map(str, seeds))}) |")  # fmt: skip
    gaps = ["| optimizer | " + " | ".join(c.label for c in cells) + " |",
            "|---|" + "---|" * len(cells)]  # fmt: skip
    for o in opts:
        row = []
        for i, c in enumerate(cells):
            if o not in c.losses:
                row.append("-")
                continue
            mean = float(np.mean(list(c.losses[o].values())))
            col = f"; {c.collapsed[o]}/{len(c.losses[o])} collapsed" if c.collapsed.get(o) else ""
            if o == BASELINE:
                row.append(f"{mean:.4f} ({BASELINE_ROW}){col}")
                continue
            g = _gap(tests, i, BASELINE, o)
            if g is None:
                row.append(f"{mean:.4f}{col}")
                continue
            s, t = g
            lo, hi = sorted((s * t["gap"].lo, s * t["gap"].hi))
            row.append(f"{mean:.4f}; {s * t['gap'].mean:+.3f} [{lo:+.3f}, {hi:+.3f}], "
                       f"Holm p {t['p_holm']:.2g}{col}")  # fmt: skip
        gaps.append(f"| {o} | " + " | ".join(row) + " |")
    ranks = [f"- {c.label}: {ranking(c, i, tests)}" for i, c in enumerate(cells)]
    knobs = [k for k in KNOB_ORDER if any(k in v for c in cells for v in c.chosen.values())]
    chosen = ["| optimizer | " + " | ".join(c.label for c in cells) + " |",
              "|---|" + "---|" * len(cells)]  # fmt: skip
    for o in opts:
        vals = [", ".join(f"{c.chosen[o][k]:.4g}" if k in c.chosen[o] else "-" for k in knobs)
                if o in c.chosen else "-" for c in cells]  # fmt: skip
        chosen.append(f"| {o} | " + " | ".join(vals) + " |")
    pairs = ["| B - A | " + " | ".join(c.label for c in cells) + " | across the cells |",
             "|---|" + "---|" * (len(cells) + 1)]  # fmt: skip
    for a, b in combinations(opts, 2):
        shown, verdict = pair_verdict(cells, tests, a, b)
        if any(x != "-" for x in shown):
            pairs.append(f"| {b} - {a} | " + " | ".join(shown) + f" | {verdict} |")
    change, notes = gap_changes(cells)
    out = [
        "# Across cells: does the ranking hold?", "",
        f"Made by `python -m study cells {' '.join(sources)}` from the results.csv files alone "
        f"(study/compare.py). Every figure is over the evaluation seeds at each optimizer's chosen "
        f"values; intervals are paired {pct} t-intervals; Holm's correction runs over every pair of "
        f"every cell below (one family of {len(tests)}); a difference holds at Holm p <= {ALPHA:.2f}.", "",
        "## The cells", "", *setup, "", *missing_note(cells),
        "## Mean loss and gap to AdamW in each cell", "", *gaps, "",
        f"## Chosen values in each cell ({', '.join(knobs)})", "", *chosen, "",
        "## Ranking in each cell", "",
        "Best first; `<`: the neighbours differ after Holm; `~`: the seeds cannot tell them apart.", "",
        *ranks, "",
        "## Every pair across the cells", "",
        "`(n.s.)`: does not hold after Holm in that cell. A pair's order holds across the cells when it "
        "has the same sign wherever it holds; it is cell-specific when it flips.", "", *pairs, "",
    ]  # fmt: skip
    if change:
        out += ["## How each gap to AdamW changes between cells", "", *notes, "", *change, ""]
    return "\n".join(out)


def figure(cells: list[Cell], path: Path) -> None:
    """Each optimizer's gap to AdamW per cell with its interval (x: log2 N or tokens where the
    cells differ in it, else the cells in order)."""
    from study.figures import _plt

    plt = _plt()
    axis = _axis(cells)
    xs = axis[1] if axis else list(range(len(cells)))
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    every = sorted({o for c in cells for o in c.losses})  # the colours of study/figures.py
    opts = [o for o in every if o != BASELINE]
    for k, o in enumerate(opts):
        pts = [(x + 0.03 * (k - len(opts) / 2), paired_interval(c.losses[BASELINE], c.losses[o]))
               for x, c in zip(xs, cells) if o in c.losses and BASELINE in c.losses]  # fmt: skip
        if not pts:
            continue
        x, iv = zip(*pts)
        mean = np.array([i.mean for i in iv])
        err = np.array([[i.mean - i.lo for i in iv], [i.hi - i.mean for i in iv]])
        ax.errorbar(x, mean, yerr=err, marker="o", capsize=3, label=o,
                    color=f"C{every.index(o) % 10}")  # fmt: skip
    ax.axhline(0.0, color="k", lw=0.8, ls="--", label="AdamW")
    ax.set_xticks(xs)
    ax.set_xticklabels([c.label for c in cells], rotation=15)
    ax.set_xlabel(f"log2 {axis[0]}" if axis else "cell")
    ax.set_ylabel(f"final val loss minus AdamW's (nats), {LEVEL:.0%} t")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m study cells", description=__doc__.split("\n")[0])
    ap.add_argument("sources", nargs="+", metavar="LABEL=PATH[@MODEL:BUDGET]")
    ap.add_argument("--out", type=Path, default=None, help="markdown file (default: stdout)")
    ap.add_argument("--figure", type=Path, default=None, help="PNG of the gaps per cell")
    args = ap.parse_args(argv)
    cells: list[Cell] = []
    try:
        for text in args.sources:
            label, path, only = parse_source(text)
            if not path.is_file():
                raise ValueError(f"{label}: no results.csv at {path} (run `python -m study "
                                 f"--report-only --out <study>` to write it)")  # fmt: skip
            cells += cells_of(label, read_csv(path), only)
    except ValueError as exc:
        print(f"study.compare: {exc}", file=sys.stderr)
        return 2
    if not cells:
        print("study.compare: no comparison cell in the sources", file=sys.stderr)
        return 2
    text = render(cells, args.sources)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text)
    if args.figure:
        figure(cells, args.figure)
        print(f"wrote {args.figure}")
    return 0
