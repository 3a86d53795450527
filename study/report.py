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

from study.curves import write_curves
from study.results import collect, read_csv, write_csv
from study.speedup import speedup
from study.stats import LEVEL, paired_interval

log = logging.getLogger("study")
REFERENCE = "adamw"
# the tuned lrs a report shows, the lr first: MARS's 1-D lr, the Muon family's AdamW part, AdamW's
# non-matrix lr (the control adamw:aux_lr=tuned)
LR_KEYS = ("lr", "lr_1d", "adamw_lr", "aux_lr")


def _by(rows: list[dict], *keys: str) -> dict:
    out: dict = defaultdict(list)
    for r in rows:
        out[tuple(r[k] for k in keys)].append(r)
    return out


def _eval_losses(rows: list[dict]) -> dict:
    """``{(optimizer, model, budget): {seed: final loss}}`` of the chosen evaluation runs."""
    out: dict = defaultdict(dict)
    for r in rows:
        if r["role"] == "eval":
            loss = r["final_val_loss"]
            out[(r["optimizer"], r["model"], r["budget"])][int(r["seed"])] = (
                loss if isinstance(loss, float) and math.isfinite(loss) else math.inf
            )
    return out


def tuning_table(rows: list[dict]) -> list[str]:
    lines = ["| model | budget | optimizer | chosen | grid (value: loss on the selection seed) | status |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for (model, budget, opt), rs in sorted(_by([r for r in rows if r["role"] == "select"],
                                              "model", "budget", "optimizer").items()):  # fmt: skip
        chosen = [r for r in rs if r["chosen"] == 1.0]
        tuned = [k for k in LR_KEYS if k in rs[0] and rs[0][k] != ""]
        pick = ", ".join(f"{k} {chosen[0][k]:.4g}" for k in tuned) if chosen else "-"
        points = ", ".join(
            "/".join(f"{r[k]:.4g}" for k in tuned) + f": {r['final_val_loss']:.4f}"
            if isinstance(r["final_val_loss"], float) else "/".join(f"{r[k]:.4g}" for k in tuned) + ": diverged"
            for r in sorted(rs, key=lambda r: tuple(r[k] for k in tuned[::-1]))
        )  # fmt: skip
        status = str(rs[0]["grid"]).replace(";", ", ")
        loud = " **CAPPED: best at the grid's edge**" if "capped" in status else ""
        lines.append(f"| {model} | {budget:g}x | {opt} | {pick} | {points} | {status}{loud} |")
    return lines


def comparison_table(rows: list[dict], main_budgets: list[float], *, bootstrap: bool) -> list[str]:
    losses = _eval_losses(rows)
    tokens = {(r["model"], r["budget"]): r["tokens"] for r in rows if r["role"] == "eval"}
    pct = f"{LEVEL:.0%}"
    lines = [f"| model | budget | optimizer | seeds | mean loss (sd) | gap to AdamW, paired {pct} t-interval | "
             f"differs from AdamW? | speedup [{pct} interval] |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for (opt, model, budget), seeds in sorted(
        losses.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])
    ):
        if budget not in main_budgets:
            continue
        vals = np.array(list(seeds.values()))
        sd = f"{vals.std(ddof=1):.4f}" if len(vals) > 1 else "-"
        cells = [model, f"{budget:g}x", opt, str(len(vals)), f"{vals.mean():.4f} ({sd})"]
        ref = losses.get((REFERENCE, model, budget))
        if opt == REFERENCE or not ref:
            lines.append(
                "| "
                + " | ".join(cells + ["reference" if opt == REFERENCE else "no AdamW runs", "", ""])
                + " |"
            )
            continue
        gap = paired_interval(ref, seeds)
        verdict = (
            ("yes: lower" if gap.hi < 0 else "yes: higher")
            if gap.significant
            else "no (interval holds 0)"
        )
        curve = {tokens[(model, b)]: s for (o, m, b), s in losses.items()
                 if o == REFERENCE and m == model and (model, b) in tokens}  # fmt: skip
        try:
            sp = speedup(curve, seeds, tokens[(model, budget)], bootstrap=bootstrap)
            sp_text = f"{sp.point} [{sp.lo}, {sp.hi}]"
        except ValueError as exc:
            sp_text = f"n/a ({exc})"
        cells += [f"{gap.mean:+.4f} [{gap.lo:+.4f}, {gap.hi:+.4f}]", verdict, sp_text]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def pairs_table(rows: list[dict], main_budgets: list[float]) -> list[str]:
    """Every pair of optimizers at a main budget: the paired gap (column minus row) over their
    shared evaluation seeds, with its t-interval; * marks an interval that excludes 0."""
    losses = _eval_losses(rows)
    lines = []
    for model, budget in sorted({(m, b) for (_, m, b) in losses if b in main_budgets}):
        opts = sorted(o for (o, m, b) in losses if (m, b) == (model, budget))
        lines += [f"{model} at {budget:g}x, loss of the column minus the row:", "",
                  "| | " + " | ".join(opts) + " |", "|---|" + "---|" * len(opts)]  # fmt: skip
        for a in opts:
            cells = []
            for b in opts:
                if a == b:
                    cells.append("")
                    continue
                g = paired_interval(losses[(a, model, budget)], losses[(b, model, budget)])
                cells.append(
                    f"{g.mean:+.3f} [{g.lo:+.3f}, {g.hi:+.3f}]{'*' if g.significant else ''}"
                )
            lines.append(f"| {a} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def reference_table(rows: list[dict]) -> list[str]:
    losses = _eval_losses(rows)
    tokens = {(r["model"], r["budget"]): r["tokens"] for r in rows if r["role"] == "eval"}
    lines = ["| model | budget | tokens | seeds | AdamW mean loss (sd) |", "|---|---|---|---|---|"]
    for (opt, model, budget), seeds in sorted(losses.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        if opt == REFERENCE:
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
    from study.plan import FIXED, short, split_variant, variant_tuned
    from study.routing import routing

    lines = ["| optimizer | parameters | update | lr |", "|---|---|---|---|"]
    for opt in sorted({r["optimizer"] for r in rows}):
        model = next(r["model"] for r in rows if r["optimizer"] == opt)
        base, variant = split_variant(opt)
        pairs = (o.split("=", 1) for o in [*FIXED.get(base, []), *variant])
        # the optimizer's own options (FIXED may also fix others, e.g. the schedule)
        options = {
            k.split(".", 1)[1]: yaml.safe_load(v) for k, v in pairs if k.startswith("optimizer.")
        }
        # a tuned aux_lr (a knob, or a variant's adamw:aux_lr=tuned) is set, so its routing
        # shows; its value is moot
        options.update({short(k): 1.0 for k in variant_tuned(opt)})
        if any(isinstance(r.get("aux_lr"), float) for r in rows if r["optimizer"] == opt):
            options["aux_lr"] = 1.0
        for params, update, lr in routing(base, model, options):
            lines.append(f"| {opt} | {params} | {update} | {lr} |")
    return lines


def figure(rows: list[dict], floors: dict, path: Path) -> None:
    """Left: each optimizer's selection grid (loss against lr). Right: AdamW's mean end loss
    against tokens, each optimizer's evaluation seeds at its budget, the n-gram floors."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    colour = {o: f"C{i}" for i, o in enumerate(sorted({r["optimizer"] for r in rows}))}
    for (opt, budget), rs in sorted(
        _by([r for r in rows if r["role"] == "select"], "optimizer", "budget").items()
    ):
        # the lr sweep: the runs whose other tuned lrs share their most common values
        rs = max(
            _by(rs, *[k for k in LR_KEYS[1:] if rs[0].get(k, "") != ""]).values(), key=len
        )
        pts = sorted(
            (r["lr"], r["final_val_loss"]) for r in rs if isinstance(r["final_val_loss"], float)
        )
        if pts:
            a.plot(
                *zip(*pts),
                "o-" if budget == min(r["budget"] for r in rows) else "s--",
                label=f"{opt} {budget:g}x",
                ms=3,
                color=colour[opt],
                alpha=1.0 if budget == min(r["budget"] for r in rows) else 0.5,
            )
    a.set_xscale("log")
    a.set_xlabel("lr (selection seed)")
    a.set_ylabel("final validation loss (nats/byte)")
    a.legend(fontsize=7)
    losses = _eval_losses(rows)
    tokens = {(r["model"], r["budget"]): r["tokens"] for r in rows if r["role"] == "eval"}
    ref = sorted(
        (tokens[(m, bu)], np.mean(list(s.values())))
        for (o, m, bu), s in losses.items()
        if o == REFERENCE
    )
    if ref:
        b.plot(*zip(*ref), "k-", lw=1, label="AdamW (mean of seeds)")
    for i, ((opt, model, budget), seeds) in enumerate(sorted(losses.items())):
        x = tokens[(model, budget)] * (1 + 0.03 * (i % 5 - 2))
        b.plot(
            [x] * len(seeds),
            list(seeds.values()),
            "o",
            ms=3,
            label=f"{opt} {budget:g}x",
            color=colour[opt],
        )
    for name, value in floors.items():
        if name in ("unigram", "bigram"):
            b.axhline(value, ls=":", c="gray")
            b.text(b.get_xlim()[0], value, f" {name} {value:.3f}", va="bottom", fontsize=7)
    b.set_xscale("log")
    b.set_xlabel("training tokens")
    b.set_ylabel("final validation loss (evaluation seeds)")
    b.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def render(rows: list[dict], floors: dict, main_budgets: list[float], *, complete: bool,
           bootstrap: bool = False, wall: str = "") -> str:  # fmt: skip
    status = (
        "complete"
        if complete
        else "PARTIAL: some cells are unfinished (the same command continues them)"
    )
    out = [
        "# Optimizer study: report", "",
        f"Status: **{status}**. Made by `python -m study` from results.csv ({len(rows)} runs){wall}.", "",
        f"Validation: the whole held-out split, {floors.get('val_tokens', 0):,} tokens; its unigram loss is "
        f"{floors.get('unigram', math.nan):.4f} and its bigram loss {floors.get('bigram', math.nan):.4f} nats/token "
        "(training-split counts, add-one smoothing): the floor any model must beat.", "",
        "## Setup", "", *setup_table(rows), "",
        "## Comparison at the main budget", "",
        f"End-of-run validation loss over the evaluation seeds (never the selection seed, the same for every "
        f"optimizer). Gap: the mean per-seed difference to AdamW with its {LEVEL:.0%} t-interval; an interval "
        "that holds 0 says the seeds cannot tell the two apart. Speedup: AdamW's tokens to reach the "
        "optimizer's mean loss over the optimizer's tokens (AdamW's losses across its budgets, monotone, "
        "interpolated in log tokens); `>B`/`<B`: beyond AdamW's measured budgets (censored at the bound B).", "",
        *comparison_table(rows, main_budgets, bootstrap=bootstrap), "",
        "## Every pair (paired over the shared evaluation seeds, 90% t-intervals)", "",
        *pairs_table(rows, main_budgets),
        "## AdamW across budgets", "", *reference_table(rows), "",
        "## Tuning (selection seed)", "", *tuning_table(rows), "",
        "## Which parameters each optimizer trains, with which update and lr", "",
        *routing_table(rows), "",
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
    study,  # noqa: ANN001 - a study.cells.Study
    *,
    bootstrap: bool = False,
    merge: list[Path] = (),
    merge_only: list[str] | None = None,
    collapse_floor: float | None = None,
) -> Path:
    """results.csv, report.md and study.png in the study's directory; ``merge``: other studies'
    results.csv whose cells join this one's (same model, seeds and protocol)."""
    from data.config import DataConfig
    from study.baselines import ngram_losses

    out = study.plan.out
    floors: dict = {}
    first = next(iter(sorted(out.glob("runs/*/*/*/*/*/config.yaml"))), None)
    if first is not None:
        floors = ngram_losses(DataConfig(**yaml.safe_load(first.read_text())["data"]))
    floor = collapse_floor if collapse_floor is not None else floors.get("bigram")
    rows, curves = collect(study, floor)
    rows += merged_rows(rows, [Path(p) for p in merge], merge_only)
    write_csv(rows, out / "results.csv")
    write_curves(curves, out / "curves.csv.gz")
    rows = read_csv(out / "results.csv")
    floors["collapse_floor"] = floor
    complete = all(s.done for s in study.states.values())
    start = out / "started.txt"
    wall = ""
    if start.is_file():
        import time

        wall = f"; wall time since the study started: {(time.time() - float(start.read_text())) / 60:.1f} min"
    text = render(
        rows, floors, study.plan.budgets, complete=complete, bootstrap=bootstrap, wall=wall
    )
    (out / "report.md").write_text(text)
    if rows:
        figure(rows, floors, out / "study.png")
    log.info("wrote %s, %s and the figure", out / "results.csv", out / "report.md")
    return out / "report.md"
