"""MARS-AdamW's loss taken apart (docs/study.md, "MARS-AdamW's loss"): at the values a study
chose for MARS-AdamW (its results.csv), on the evaluation seeds, without tuning:

- gamma {chosen, 0} x betas {MARS-AdamW's (0.95, its beta2), AdamW's (0.9, AdamW's beta2)} x the
  gains' weight decay (``weight_decay_1d``) {0.1, 0}: the eight corners (the all-MARS corner is
  the study's own MARS-AdamW cell, merged, not rerun);
- exact mode once, and a batch of 8,192 tokens once (4x the study's: the budget's tokens in a
  quarter of the steps);
- the betas switch with kappa held: AdamW's betas with gamma scaled so that the correction's
  weight kappa = gamma beta1 / (1 - beta1) stays MARS-AdamW's (0.475 at gamma 0.025, beta1
  0.95: gamma 0.0528 at beta1 0.9), since the plain betas switch also halves kappa.

    python -m study factorial --from runs/referee/results.csv [--out runs/referee-factorial]
                              [study options, e.g. --jobs 2] [-- train.py overrides]

It is ``python -m study`` with these cells, ``--untuned`` at ``--center-from`` the given file,
and that file's AdamW and MARS-AdamW cells merged, so the report pairs every corner with both.

What the factorial says (``effects``; ``factorial.md`` beside the report): each factor's effect
on the evaluation seeds, paired per seed, and its share of MARS-AdamW's gap to AdamW.

Three factors, each at MARS-AdamW's setting (``+``) or AdamW's (``-``): gamma (the variance
reduction: the chosen gamma or 0), betas ((0.95, MARS-AdamW's beta2) or (0.9, AdamW's beta2)) and
the gains' weight decay (``weight_decay_1d`` 0.1 or 0). Per evaluation seed s, with L(corner, s)
the final validation loss:

- gap(s) = L(MARS-AdamW, s) - L(AdamW, s), both at their chosen values;
- switch(F, s) = L(MARS-AdamW, s) - L(MARS-AdamW with F at AdamW's setting, s): what moving that
  factor alone recovers;
- main(F, s) = mean of L over the four corners with F at ``+`` minus the mean over the four with F
  at ``-`` (the factorial's main effect, averaged over the other two factors);
- residual(s) = L(every factor at AdamW's setting, s) - L(AdamW, s): what the three factors leave
  (the knobs MARS-AdamW chose, its routing of the embedding through the correction);
- exact mode, the 8,192-token batch and the betas with kappa held as switches from MARS-AdamW.

Each is a mean over the shared seeds with its paired 90% t-interval; a share is the mean effect
over the mean gap. A factor explains at least half of the gap when its switch's share is at least
0.5; the interval says whether the seeds can tell.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from analysis.stats import Interval, mean_interval

BASE = "mars-adamw"
EXTRAS = ("exact mode", "batch 8,192 tokens", "betas alone, kappa held")  # after the corners


def kappa_held_gamma(gamma: float, beta1: float, to_beta1: float) -> float:
    """The gamma at ``to_beta1`` that keeps the correction's weight ``gamma beta1 / (1 - beta1)``
    (docs/study.md, "MARS-AdamW's loss"), to 4 decimals: 0.025 at 0.95 -> 0.0528 at 0.9."""
    kappa = gamma * beta1 / (1 - beta1)
    return round(kappa * (1 - to_beta1) / to_beta1, 4)


def variants(chosen: dict, adamw_beta2: float) -> list[str]:
    """The factorial's cells (variant names) at ``chosen`` (MARS-AdamW's knob values)."""
    gamma = chosen.get("gamma", 0.025)
    mars_betas = f"[0.95,{chosen['beta2']!r}]"
    adamw_betas = f"[0.9,{adamw_beta2!r}]"
    out = []
    for g in (gamma, 0.0):
        for betas in (mars_betas, adamw_betas):
            for wd1 in (0.1, 0.0):
                if g == gamma and betas == mars_betas and wd1 == 0.1:
                    continue  # the study's own cell
                out.append(f"{BASE}:gamma={g!r},betas={betas},weight_decay_1d={wd1!r}")
    held = kappa_held_gamma(gamma, 0.95, 0.9)
    return out + [f"{BASE}:mode=exact", f"{BASE}:batch_tokens=8192",
                  f"{BASE}:gamma={held!r},betas={adamw_betas},weight_decay_1d=0.1"]  # fmt: skip


def fields(source: Path, cell: str | None = None) -> dict:
    """The factorial's Plan fields (study/plan.py) at the values ``source`` (a study's
    results.csv) chose for MARS-AdamW: its cells untuned at those values, that file's AdamW and
    MARS-AdamW cells merged. Raises ValueError (one line)."""
    from study.results import read_csv

    if not source.is_file():
        raise ValueError(f"--from {source}: no such file")
    picked = chosen_pair(read_csv(source))
    if picked is None:
        raise ValueError(f"{source} has no chosen {BASE} or adamw cell yet")
    base, adamw = picked
    cells = variants(base, _beta2(adamw))
    model, budget = base["model"], base["budget"]
    return {"optimizers": cells, "untuned": cells, "models": [model], "budgets": [budget],
            "baseline_budgets": [], "center_from": source,
            "center_cell": cell or f"{model}:{budget:g}", "merge": [source],
            "merge_only": ["adamw", BASE]}  # fmt: skip


def finish(plan, code: int) -> int:  # noqa: ANN001 - a study.plan.Plan
    """After the factorial's study: its factorial.md beside the report."""
    results = plan.out / "results.csv"
    if code == 0 and results.is_file() and not plan.dry_run:
        from study.results import read_csv

        (plan.out / "factorial.md").write_text(
            "# MARS-AdamW's loss taken apart (python -m study factorial)\n\n"
            "Effects on the final validation loss over the evaluation seeds (a positive effect:"
            " MARS-AdamW's setting costs that much; study/findings/factorial.py says how each is "
            "computed).\n\n" + markdown(read_csv(results))
        )
    return code


def main(argv: list[str] | None = None) -> int:
    from study import cli

    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m study factorial", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--from", dest="source", type=Path, required=True, metavar="CSV")
    ap.add_argument("--out", type=Path, default=Path("runs/referee-factorial"))
    ap.add_argument("--center-cell", default=None, metavar="MODEL:BUDGET")
    args, rest = ap.parse_known_args(argv)
    try:
        factorial = fields(args.source, args.center_cell)
        args_, extra = cli.parse(rest)
        for key, value in factorial.items():
            setattr(args_, key, value)
        args_.out = args.out
        plan = cli.plan_of(args_, extra)
    except ValueError as exc:
        raise SystemExit(f"study.factorial: {exc}") from None
    return finish(plan, cli.run(plan, cli.command_line(plan)))


FACTORS = ("gamma", "betas", "gains' weight decay")


def corners(chosen: dict, adamw_beta2: float) -> dict[tuple[bool, bool, bool], str]:
    """(gamma is MARS's, betas are MARS's, gains decay is MARS's) -> the optimizer name of its
    cell (the all-MARS corner is the study's own MARS-AdamW cell)."""
    names = variants(chosen, adamw_beta2)[:7]  # the order of study.findings.factorial.variants
    out = {(True, True, True): BASE}
    i = 0
    for g in (True, False):
        for b in (True, False):
            for d in (True, False):
                if (g, b, d) != (True, True, True):
                    out[(g, b, d)] = names[i]
                    i += 1
    return out


def _is_chosen_eval(r: dict) -> bool:
    return r.get("role") == "eval" and r.get("chosen") in (1, 1.0, "1")


def _beta2(adamw: dict) -> float:
    value = adamw.get("beta2")
    return 0.95 if value in (None, "") else float(value)


def chosen_pair(rows: list[dict]) -> tuple[dict, dict] | None:
    """MARS-AdamW's chosen evaluation row and AdamW's in the same cell (model and budget), or
    None while either is missing. The source also holds AdamW's baseline budgets (2x, 4x, whose
    carried knobs are blank), which must not stand in for AdamW at MARS-AdamW's budget."""
    base = next((r for r in rows if r.get("optimizer") == BASE and _is_chosen_eval(r)), None)
    if base is None:
        return None
    adamw = next((r for r in rows if r.get("optimizer") == "adamw" and _is_chosen_eval(r)
                  and _same_cell(r, base)), None)  # fmt: skip
    return None if adamw is None else (base, adamw)


def _same_cell(r: dict, base: dict) -> bool:
    return r.get("model") == base.get("model") and float(r.get("budget", 0)) == float(
        base.get("budget", 0)
    )


def losses(rows: list[dict]) -> dict[str, dict[int, float]]:
    """{optimizer: {seed: final loss}} of the evaluation rows at each cell's chosen values."""
    out: dict[str, dict[int, float]] = {}
    for r in rows:
        if _is_chosen_eval(r):
            out.setdefault(str(r["optimizer"]), {})[int(r["seed"])] = float(r["final_val_loss"])
    return out


def _diff(a: dict[int, float], b: dict[int, float], seeds: list[int]) -> list[float]:
    return [a[s] - b[s] for s in seeds]


def effects(rows: list[dict], level: float = 0.9) -> dict[str, Interval] | None:
    """Every effect of the module docstring (name -> Interval over the seeds every cell shares),
    or None while a cell of the factorial, AdamW or MARS-AdamW has no evaluation row."""
    picked = chosen_pair(rows)
    if picked is None:
        return None
    chosen, adamw = picked
    by = losses([r for r in rows if _same_cell(r, chosen)])
    cells = corners(chosen, _beta2(adamw))
    extra = variants(chosen, _beta2(adamw))[7:]  # EXTRAS
    need = [*cells.values(), "adamw"]
    if any(n not in by for n in need):
        return None
    seeds = sorted(set.intersection(*(set(by[n]) for n in need)))
    if not seeds:
        return None
    mars, ref = by[BASE], by["adamw"]
    out = {"gap: MARS-AdamW - AdamW": mean_interval(_diff(mars, ref, seeds), level)}
    for k, name in enumerate(FACTORS):
        alone = tuple(j != k for j in range(3))  # F at AdamW's setting, the others MARS's
        out[f"switch {name} alone"] = mean_interval(_diff(mars, by[cells[alone]], seeds), level)
    for k, name in enumerate(FACTORS):
        plus = [n for c, n in cells.items() if c[k]]
        minus = [n for c, n in cells.items() if not c[k]]
        main = [sum(by[n][s] for n in plus) / 4 - sum(by[n][s] for n in minus) / 4 for s in seeds]
        out[f"main effect of {name}"] = mean_interval(main, level)
    out["switch all three"] = mean_interval(
        _diff(mars, by[cells[(False, False, False)]], seeds), level
    )
    out["residual: all three at AdamW's - AdamW"] = mean_interval(
        _diff(by[cells[(False, False, False)]], ref, seeds), level
    )
    for name, label in zip(extra, EXTRAS):
        common = [s for s in seeds if s in by.get(name, {})]
        if common:
            key = f"switch {label}" if "alone" in label else f"switch to {label}"
            out[key] = mean_interval(_diff(mars, by[name], common), level)
    return out


def markdown(rows: list[dict], level: float = 0.9) -> str:
    """The effects table (a positive effect: MARS-AdamW's setting costs that much loss)."""
    eff = effects(rows, level)
    if eff is None:
        return ("The factorial is incomplete: a corner, AdamW or MARS-AdamW has no evaluation "
                "runs yet (the same command continues it).\n")  # fmt: skip
    gap = eff["gap: MARS-AdamW - AdamW"].mean
    pct = f"{level:.0%}"
    lines = [
        f"| effect | mean over seeds [paired {pct} t-interval] | seeds | share of the gap |",
        "|---|---|---|---|",
    ]
    for name, iv in eff.items():
        share = "" if name.startswith("gap") or gap == 0 else f"{iv.mean / gap:+.0%}"
        lines.append(f"| {name} | {iv.mean:+.4f} [{iv.lo:+.4f}, {iv.hi:+.4f}] | {iv.n} | {share} |")
    return "\n".join(lines) + "\n"
