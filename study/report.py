"""The study's report, made only from results.csv: OUT/report.md and OUT/study.png.

Tables: the tuning (each cell's grid, its chosen values, bracketed or capped), the comparison at
each main budget (mean end-of-run validation loss over the evaluation seeds, the paired gap to
AdamW with its t-interval and whether it excludes 0, the data-equivalent speedup with its
interval, censored outside AdamW's measured budgets), AdamW across budgets, and which parameters
each optimizer trains with which update and lr; beside the validation set's unigram and bigram
losses.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import yaml

from analysis.speedup import data_equivalent_speedup
from analysis.stats import LEVEL, paired_interval
from runtime import runfiles
from study.curves import read_curves, write_curves
from study.figures import curves_figure, study_figure
from study.results import collect, read_csv, write_csv
from study.tables import (
    BASELINE,
    BASELINE_ROW,
    collapse_table,
    commits,
    cpus,
    eval_losses,
    knob_table,
    pairs_holm,
    swap_table,
)

log = logging.getLogger("study")


def _by(rows: list[dict], *keys: str) -> dict:
    out: dict = defaultdict(list)
    for r in rows:
        out[tuple(r[k] for k in keys)].append(r)
    return out


def comparison_table(rows: list[dict], main_budgets: list[float], *, bootstrap: bool,
                     holm_p: dict | None = None) -> list[str]:  # fmt: skip
    """Per optimizer at a main budget: mean (sd), median, collapses, the paired gap to AdamW
    with its t-interval, whether it differs (and still does after Holm's correction over every
    pair of the report), the speedup with its interval."""
    losses = eval_losses(rows)
    tokens = {(r["model"], r["budget"]): r["tokens"] for r in rows if r["role"] == "eval"}
    collapsed = defaultdict(int)
    for r in rows:
        if r["role"] == "eval" and r.get("chosen", 1.0) == 1.0 and r.get("collapsed"):
            collapsed[(r["optimizer"], r["model"], r["budget"])] += 1
    holm_p = holm_p or {}
    pct = f"{LEVEL:.0%}"
    lines = [f"| model | budget | optimizer | seeds | mean loss (sd) | median | collapsed | gap to AdamW, "
             f"paired {pct} t-interval | differs from AdamW? (Holm p) | speedup [{pct} interval] |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for (opt, model, budget), seeds in sorted(
        losses.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])
    ):
        if budget not in main_budgets:
            continue
        vals = np.array(list(seeds.values()))
        sd = f"{vals.std(ddof=1):.4f}" if len(vals) > 1 and np.all(np.isfinite(vals)) else "-"
        cells = [model, f"{budget:g}x", opt, str(len(vals)), f"{vals.mean():.4f} ({sd})",
                 f"{np.median(vals):.4f}", f"{collapsed[(opt, model, budget)]}/{len(vals)}"]  # fmt: skip
        ref = losses.get((BASELINE, model, budget))
        if opt == BASELINE or not ref:
            lines.append(
                "| "
                + " | ".join(cells + [BASELINE_ROW if opt == BASELINE else "no AdamW runs", "", ""])
                + " |"
            )
            continue
        gap = paired_interval(ref, seeds)
        p = holm_p.get((model, budget, *sorted((opt, BASELINE))))
        side = "lower" if gap.hi < 0 else "higher"
        if not gap.significant:
            verdict = "no (interval holds 0)"
        elif p is None:
            verdict = f"yes: {side}"
        elif p <= 1 - LEVEL:
            verdict = f"yes: {side} (Holm p {p:.2g}: holds)"
        else:  # the interval excludes 0, the family-wise test does not
            verdict = f"not after correction ({side} before it; Holm p {p:.2g})"
        curve = {tokens[(model, b)]: s for (o, m, b), s in losses.items()
                 if o == BASELINE and m == model and (model, b) in tokens}  # fmt: skip
        if len(curve) < 2:  # one AdamW budget: no curve to read a speedup off
            sp_text = "n/a (AdamW at one budget)"
        else:
            try:
                sp = data_equivalent_speedup(
                    curve, seeds, tokens[(model, budget)], bootstrap=bootstrap
                )
                sp_text = f"{sp.point} [{sp.lo}, {sp.hi}]"
            except ValueError as exc:
                sp_text = f"n/a ({exc})"
        cells += [f"{gap.mean:+.4f} [{gap.lo:+.4f}, {gap.hi:+.4f}]", verdict, sp_text]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def baseline_table(rows: list[dict]) -> list[str]:
    losses = eval_losses(rows)
    tokens = {(r["model"], r["budget"]): r["tokens"] for r in rows if r["role"] == "eval"}
    lines = ["| model | budget | tokens | seeds | AdamW mean loss (sd) |", "|---|---|---|---|---|"]
    for (opt, model, budget), seeds in sorted(losses.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        if opt == BASELINE:
            v = np.array(list(seeds.values()))
            sd = f"{v.std(ddof=1):.4f}" if len(v) > 1 else "-"
            lines.append(
                f"| {model} | {budget:g}x | {tokens[(model, budget)]:,.0f} | {len(v)} | {v.mean():.4f} ({sd}) |"
            )
    return lines


def setup_table(rows: list[dict]) -> list[str]:
    """Per (model, budget): N, tokens, steps, batch, warmup, and the seeds that ran."""
    lines = ["| model | N (block params) | budget | tokens | steps x batch | warmup | selection seeds | evaluation seeds |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for (model, budget), rs in sorted(_by(rows, "model", "budget").items()):
        r = rs[0]
        sel = sorted({int(x["seed"]) for x in rs if x["role"] == "select"})
        ev = sorted({int(x["seed"]) for x in rs if x["role"] == "eval"})
        lines.append(f"| {model} | {r['non_embedding_params']:,.0f} | {budget:g}x ({20 * budget:g} tokens/param) | "
                     f"{r['tokens']:,.0f} | {r['max_steps']:.0f} x {r['batch_tokens']:,.0f} | {r['warmup_steps']:.0f} | "
                     f"{', '.join(map(str, sel)) or '-'} | {', '.join(map(str, ev)) or '-'} |")  # fmt: skip
    return lines


def routing_table(rows: list[dict]) -> list[str]:
    from study.plan import FIXED, short
    from study.routing import routing
    from study.variant import Variant

    lines = ["| optimizer | parameters | update | lr |", "|---|---|---|---|"]
    for opt in sorted({r["optimizer"] for r in rows}):
        model = next(r["model"] for r in rows if r["optimizer"] == opt)
        variant = Variant.parse(opt)
        base = variant.base
        pairs = (o.split("=", 1) for o in [*FIXED.get(base, []), *variant.overrides])
        # the optimizer's own options (FIXED may also fix others, e.g. the schedule)
        options = {
            k.split(".", 1)[1]: yaml.safe_load(v) for k, v in pairs if k.startswith("optimizer.")
        }
        # a tuned aux_lr (a knob, or a variant's adamw:aux_lr=tuned) is set, so its routing
        # shows; its value is moot
        options.update({short(k): 1.0 for k in variant.tuned})
        if any(isinstance(r.get("aux_lr"), float) for r in rows if r["optimizer"] == opt):
            options["aux_lr"] = 1.0
        for params, update, lr in routing(base, model, options):
            lines.append(f"| {opt} | {params} | {update} | {lr} |")
    return lines


def render(rows: list[dict], floors: dict, main_budgets: list[float], *, complete: bool,
           bootstrap: bool = False, wall: str = "", figures: tuple = ()) -> str:  # fmt: skip
    status = (
        "complete"
        if complete
        else "PARTIAL: some cells are unfinished (the same command continues them)"
    )
    pairs, pair_data = pairs_holm(rows, main_budgets)
    holm_p = {(p["model"], p["budget"], p["a"], p["b"]): p["p_holm"] for p in pair_data}
    floor = floors.get("collapse_floor")
    seeds = {role: sorted({int(r["seed"]) for r in rows if r["role"] == role})
             for role in ("select", "eval")}  # fmt: skip
    out = [
        "# Optimizer study: report", "",
        f"Status: **{status}**. Made by `python -m study` from results.csv ({len(rows)} runs){wall}.", "",
        f"Validation: the whole held-out split, {floors.get('val_tokens', 0):,} tokens; its unigram loss is "
        f"{floors.get('unigram', math.nan):.4f} and its bigram loss {floors.get('bigram', math.nan):.4f} nats/token "
        "(training-split counts, add-one smoothing). A run **collapsed** when it ended at or above "
        f"{floor if floor is not None else math.nan:.4f} (the collapse floor), diverged, or its training loss rose "
        "more than 1.25x above its lowest point (study/curves.py).", "",
        f"Selection seeds {', '.join(map(str, seeds['select'])) or '-'} (every knob chosen by the mean over them); "
        f"evaluation seeds {', '.join(map(str, seeds['eval'])) or '-'} (never used to choose; the same for every "
        "optimizer).", "",
        *[f"![{name}]({name})" for name in figures], "",
        "## Setup", "", *setup_table(rows), "",
        "## Comparison at the main budget", "",
        f"End-of-run validation loss over the evaluation seeds at the chosen values. Gap: the mean per-seed "
        f"difference to AdamW with its {LEVEL:.0%} t-interval; an interval that holds 0 says the seeds cannot "
        f"tell the two apart; Holm p: the paired t-test's p-value adjusted over every pair of this report "
        f"(a difference holds after correction at p <= {1 - LEVEL:.2f}). Speedup: AdamW's tokens to reach the "
        "optimizer's mean loss over the optimizer's tokens (AdamW's losses across its budgets, made monotone, "
        "a monotone cubic in log tokens; analysis/speedup.py); `>B`/`<B`: beyond AdamW's measured budgets (censored at the bound B); "
        "n/a without AdamW at two budgets or more.", "",
        *comparison_table(rows, main_budgets, bootstrap=bootstrap, holm_p=holm_p), "",
        "## Collapses and medians (evaluation runs; selection runs beside)", "",
        *collapse_table(rows, main_budgets), "",
        "## Every pair, Holm-corrected", "", *pairs, "",
        "## Selection error: the seed sets swapped", "",
        "The final lr line's finalists (every value run on all selection seeds) also ran on the "
        "evaluation seeds. sel->eval: chosen on the selection seeds, read on the evaluation seeds (the "
        "protocol); eval->sel: chosen on the evaluation seeds, read on the selection seeds. Where the two "
        "choices and gaps agree, the selection did not flatter the optimizer. Winner's curse: the "
        "chosen values' mean on the selection seeds that chose them minus their mean on the "
        "evaluation seeds (negative: the choice flattered itself).", "",
        *swap_table(rows, main_budgets), "",
        "## AdamW across budgets", "", *baseline_table(rows), "",
        "## Tuning: every knob's values, the choice, the runs spent", "", *knob_table(rows), "",
        "## Which parameters each optimizer trains, with which update and lr", "",
        *routing_table(rows), "",
        "## Provenance: the commits the rows come from", "",
        "`+dirty`: tracked files differed from the commit; `+untracked(...)`: only the untracked "
        "files named sat beside the checkout (the tracked code is the commit's; each run's git.diff "
        "holds them).", "", *commits(rows), "",
        "The CPUs they ran on (another CPU kind takes other vector kernels: the same command there "
        "agrees statistically, not to the last bit):", "", *cpus(rows), "",
    ]  # fmt: skip
    return "\n".join(out)


def merged_rows(own: list[dict], paths: list[Path], only: list[str] | None = None) -> list[dict]:
    """The rows of other studies' results.csv files (``--merge``) whose cell (optimizer, model,
    budget) this study does not have, so each cell comes from one study. Their run_dir is
    prefixed with the file it came from."""
    have = {(r["optimizer"], r["model"], float(r["budget"])) for r in own}
    extra: list[dict] = []
    for path in paths:
        for r in read_csv(path):
            cell = (r["optimizer"], r["model"], float(r["budget"]))
            if cell in have or (only and r["optimizer"] not in only):
                continue
            r["run_dir"] = f"{path.parent.name}:{r['run_dir']}"
            extra.append(r)
        have |= {(r["optimizer"], r["model"], float(r["budget"])) for r in extra}
    return extra


def write_report(
    study,  # noqa: ANN001 - a study.state.Study
    *,
    bootstrap: bool = False,
    merge: list[Path] = (),
    merge_only: list[str] | None = None,
    collapse_floor: float | None = None,
) -> Path:
    """results.csv, curves.csv.gz, report.md, curves.png and study.png in the study's directory; ``merge``: other studies'
    results.csv whose cells join this one's (same model, seeds and protocol)."""
    from data.config import DataConfig
    from study.floors import ngram_losses

    out = study.plan.out
    floors: dict = {}
    first = next(iter(sorted(out.glob(f"runs/*/*/*/*/*/{runfiles.CONFIG}"))), None)
    data = (runfiles.read_config(first.parent) or {})["data"] if first is not None else None
    if data is None and study.ledger.rows:  # every run in the ledger: the study's own data
        from runtime.config_files import load_config

        data = load_config("experiment/study")["data"]
    if data is not None:
        try:  # the floors read the shards: a moved or deleted data dir says how to prepare it
            floors = ngram_losses(DataConfig(**data))
        except FileNotFoundError as exc:
            raise SystemExit(
                f"study report: the collapse floor needs the runs' data: {exc}"
            ) from None
    floor = collapse_floor if collapse_floor is not None else floors.get("bigram")
    rows, curves = collect(study, floor)
    rows += merged_rows(rows, [Path(p) for p in merge], merge_only)
    write_csv(rows, out / "results.csv")
    write_curves(curves, out / "curves.csv.gz")
    rows = read_csv(out / "results.csv")
    floors["collapse_floor"] = floor
    complete = all(s.done for s in study.states.values())
    # the runs' own time, read from the ledger (not the time since the study started: a report
    # made again from the same ledger is then the same, byte for byte)
    spent = sum(r["wall_s"] for r in rows if isinstance(r.get("wall_s"), float)
                and math.isfinite(r["wall_s"]))  # fmt: skip
    wall = f"; the runs' own time: {spent / 3600:.1f} h of one process each" if spent else ""
    figures: list[str] = []
    if rows:
        if curves_figure(rows, read_curves(out / "curves.csv.gz"), floors, study.plan.budgets,
                         out / "curves.png"):  # fmt: skip
            figures.append("curves.png")
        study_figure(rows, floors, out / "study.png")
        figures.append("study.png")
    text = render(rows, floors, study.plan.budgets, complete=complete, bootstrap=bootstrap,
                  wall=wall, figures=tuple(figures))  # fmt: skip
    (out / "report.md").write_text(text)
    log.info("wrote %s, %s and its figures", out / "results.csv", out / "report.md")
    return out / "report.md"
