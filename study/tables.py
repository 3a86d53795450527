"""The report's tables of the referee's protocol, made from results.csv rows alone: the tuning
(each knob's lattice values tried, the choice, the runs spent), the cells with their collapse
rates and medians, every pair with Holm's correction, the selection error (the swap), and the
commits the rows come from."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from analysis.stats import LEVEL, holm, paired_interval, paired_p_value
from study.knobs import KNOB_ORDER

BASELINE = "adamw"  # the study's baseline optimizer: every gap and speedup is measured to it
# What a table prints in the baseline's own row: the committed reports' word (they come back
# byte for byte from their ledgers), older than the name "baseline" in the code.
BASELINE_ROW = "reference"


def _by(rows: list[dict], *keys: str) -> dict:
    out: dict = defaultdict(list)
    for r in rows:
        out[tuple(r[k] for k in keys)].append(r)
    return out


def _loss(r: dict) -> float:
    x = r["final_val_loss"]
    return x if isinstance(x, float) and math.isfinite(x) else math.inf


def tuned_knobs(rows: list[dict]) -> list[str]:
    """The knobs a cell's rows name in their ``grid`` column, in the knobs' order."""
    names = [part.split(":")[0] for part in str(rows[0].get("grid", "")).split(";") if part]
    names = [n for n in names if n != "passes"]
    return [k for k in KNOB_ORDER if k in names] + [k for k in names if k not in KNOB_ORDER]


def _flag(rows: list[dict], key: str) -> str:
    for part in str(rows[0].get("grid", "")).split(";"):
        if part.startswith(f"{key}:"):
            return part.split(":", 1)[1]
    return "open"


def knob_table(rows: list[dict]) -> list[str]:
    """Per cell and knob: the values tried on the selection seeds, the chosen value (and how
    its search ended), and the cell's selection runs and seeds."""
    out = ["| model | budget | optimizer | knob | values tried | chosen | selection runs |",
           "|---|---|---|---|---|---|---|"]  # fmt: skip
    select = _by([r for r in rows if r["role"] == "select"], "model", "budget", "optimizer")
    chosen_rows = _by([r for r in rows if r["role"] == "eval" and r["chosen"] == 1.0],
                      "model", "budget", "optimizer")  # fmt: skip
    for (model, budget, opt), rs in sorted(select.items()):
        seeds = sorted({int(r["seed"]) for r in rs})
        pick = (chosen_rows.get((model, budget, opt)) or [{}])[0]
        passes = " (passes capped)" if "passes:capped" in str(rs[0].get("grid")) else ""
        for i, k in enumerate(tuned_knobs(rs)):
            tried = sorted({r[k] for r in rs if isinstance(r.get(k), float)})
            value = pick.get(k, "-")
            value = f"{value:.4g}" if isinstance(value, float) else value
            spent = f"{len(rs)} on seeds {', '.join(map(str, seeds))}{passes}" if i == 0 else ""
            out.append(f"| {model} | {budget:g}x | {opt} | {k} | "
                       f"{', '.join(f'{v:.4g}' for v in tried)} | {value} ({_flag(rs, k)}) | {spent} |")  # fmt: skip
    return out


def eval_losses(rows: list[dict]) -> dict:
    """``{(optimizer, model, budget): {seed: final loss}}`` of the chosen evaluation runs."""
    out: dict = defaultdict(dict)
    for r in rows:
        if r["role"] == "eval" and r.get("chosen", 1.0) == 1.0:
            out[(r["optimizer"], r["model"], r["budget"])][int(r["seed"])] = _loss(r)
    return out


def collapse_table(rows: list[dict], main_budgets: list[float]) -> list[str]:
    """Per cell: mean (sd), median, collapse rate of the evaluation runs, and of every
    selection run."""
    out = ["| model | budget | optimizer | mean (sd) | median | collapsed (eval) | collapsed (selection) |",
           "|---|---|---|---|---|---|---|"]  # fmt: skip
    evals = _by([r for r in rows if r["role"] == "eval" and r.get("chosen", 1.0) == 1.0],
                "model", "budget", "optimizer")  # fmt: skip
    select = _by([r for r in rows if r["role"] == "select"], "model", "budget", "optimizer")
    for (model, budget, opt), rs in sorted(evals.items()):
        x = np.array([_loss(r) for r in rs])
        sd = f"{x.std(ddof=1):.4f}" if len(x) > 1 and np.all(np.isfinite(x)) else "-"
        col = sum(int(r.get("collapsed") or 0) for r in rs)
        reasons = sorted({str(r.get("collapse")) for r in rs if r.get("collapsed")})
        sel = select.get((model, budget, opt), [])
        scol = sum(int(r.get("collapsed") or 0) for r in sel)
        out.append(f"| {model} | {budget:g}x | {opt} | {x.mean():.4f} ({sd}) | {np.median(x):.4f} | "
                   f"{col}/{len(rs)}{' (' + ', '.join(reasons) + ')' if reasons else ''} | "
                   f"{scol}/{len(sel)} |")  # fmt: skip
    return out


def pairs_holm(rows: list[dict], main_budgets: list[float]) -> tuple[list[str], list[dict]]:
    """Every pair of optimizers of a cell (row minus column... spelt out: ``B - A``), its paired
    interval, p-value and Holm-adjusted p over every pair of the report; and the pairs as data."""
    losses = eval_losses(rows)
    pairs = []
    for model, budget in sorted({(m, b) for (_, m, b) in losses if b in main_budgets}):
        opts = sorted(o for (o, m, b) in losses if (m, b) == (model, budget))
        for i, a in enumerate(opts):
            for b in opts[i + 1 :]:
                A, B = losses[(a, model, budget)], losses[(b, model, budget)]
                if len(set(A) & set(B)) < 2:
                    continue
                gap = paired_interval(A, B)
                pairs.append({"model": model, "budget": budget, "a": a, "b": b, "gap": gap,
                              "p": paired_p_value(A, B)})  # fmt: skip
    for p, adj in zip(pairs, holm([p["p"] for p in pairs])):
        p["p_holm"] = adj
    out = [f"| model | budget | B - A | gap, paired {LEVEL:.0%} t-interval | p | Holm p | "
           f"holds after correction ({1 - LEVEL:.0%} family-wise)? |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for p in pairs:
        g = p["gap"]
        holds = "yes" if p["p_holm"] <= 1 - LEVEL else "no"
        out.append(f"| {p['model']} | {p['budget']:g}x | {p['b']} - {p['a']} | {g.mean:+.4f} "
                   f"[{g.lo:+.4f}, {g.hi:+.4f}] | {p['p']:.3g} | {p['p_holm']:.3g} | {holds} |")  # fmt: skip
    return out, pairs


def swap_table(rows: list[dict], main_budgets: list[float]) -> list[str]:
    """Selection error: the final lr line's finalists ran on both seed sets. Chosen on the
    selection seeds and read on the evaluation seeds (the protocol), against chosen on the
    evaluation seeds and read on the selection seeds; each optimizer's gap to AdamW both ways;
    and the winner's curse: the chosen values' mean on the selection seeds that chose them minus
    their mean on the evaluation seeds (negative: the choice flattered itself)."""
    out = ["| model | budget | optimizer | lr chosen on selection / on evaluation seeds | "
           "loss read on the other set (sel->eval, eval->sel) | gap to AdamW (sel->eval, eval->sel) | "
           "winner's curse (chosen: selection - evaluation mean) |",
           "|---|---|---|---|---|---|---|"]  # fmt: skip
    means: dict = {}
    for (model, budget, opt), rs in sorted(_by(rows, "model", "budget", "optimizer").items()):
        if budget not in main_budgets:
            continue
        chosen = [r for r in rs if r["role"] == "eval" and r["chosen"] == 1.0]
        if not chosen:
            continue
        others = [k for k in tuned_knobs(chosen) if k != "lr"]
        same = [r for r in rs if all(math.isclose(r[k], chosen[0][k]) for k in others)]
        by_lr: dict = defaultdict(lambda: defaultdict(list))
        for r in same:
            by_lr[r["lr"]][r["role"]].append(_loss(r))
        full = {lr: d for lr, d in by_lr.items() if d["eval"] and d["select"]}
        if len(full) < 2:
            continue
        sel_pick = chosen[0]["lr"]
        eval_pick = min(full, key=lambda lr: (np.mean(full[lr]["eval"]), lr))
        sel_best = min(full, key=lambda lr: (np.mean(full[lr]["select"]), lr))
        curse = (np.mean(full[sel_pick]["select"]) - np.mean(full[sel_pick]["eval"])
                 if sel_pick in full else math.nan)  # fmt: skip
        means[(model, budget, opt)] = (np.mean(full[sel_pick]["eval"]) if sel_pick in full
                                       else math.nan, np.mean(full[eval_pick]["select"]),
                                       sel_pick, eval_pick, sel_best, curse)  # fmt: skip
    for (model, budget, opt), (a, b, sp, ep, sb, curse) in means.items():
        ref = means.get((model, budget, BASELINE))
        if opt == BASELINE:
            gaps = BASELINE_ROW
        else:
            gaps = f"{a - ref[0]:+.4f}, {b - ref[1]:+.4f}" if ref else "no AdamW swap"
        # a capped search's lr line ran before the other knobs last moved: at their final values
        # the selection seeds may prefer another finalist (study/state.py runs them there)
        sp_text = (
            f"{sp:.4g}" if math.isclose(sb, sp) else f"{sp:.4g} (at the final knobs: {sb:.4g})"
        )
        out.append(
            f"| {model} | {budget:g}x | {opt} | {sp_text} / {ep:.4g} | {a:.4f}, {b:.4f} | {gaps} "
            f"| {curse:+.4f} |"
        )
    return out


def cpus(rows: list[dict]) -> list[str]:
    """The CPU kinds the rows ran on, with their run counts: a run reruns bit for bit on its own
    kind only (study.rerun), so rows of several kinds agree statistically, not to the last bit."""
    count: dict = defaultdict(int)
    for r in rows:
        count[str(r.get("cpu") or "not recorded (runs before commit ec03656)")] += 1
    return [f"- {c}: {n} runs" for c, n in sorted(count.items(), key=lambda kv: -kv[1])]


def commits(rows: list[dict]) -> list[str]:
    """The commits the rows come from, with their run counts (``+dirty``: uncommitted code), and
    the commits resumed runs went on under (the ``resumed`` column: ``STEP@COMMIT; ...``)."""
    count: dict = defaultdict(int)
    later: dict = defaultdict(int)
    for r in rows:
        count[str(r.get("commit") or "unknown")] += 1
        for session in filter(None, str(r.get("resumed") or "").split("; ")):
            later[session.split("@", 1)[-1].split(" on ")[0]] += 1
    out = [f"- `{c}`: {n} runs" for c, n in sorted(count.items(), key=lambda kv: -kv[1])]
    return out + [
        f"- `{c}`: {n} resumed {'session' if n == 1 else 'sessions'} of runs started under an "
        "earlier commit (the `resumed` column)"
        for c, n in sorted(later.items(), key=lambda kv: -kv[1])
    ]
