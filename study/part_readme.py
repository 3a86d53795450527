"""Each published part tells its own story: ``results/<study>/<part>/README.md``, rendered from
the part's ledger, the definition (its ``description``: the part's question) and the study's one
family (its claims with their Holm p), so the numbers a reader meets beside the data are never
typed by hand (tests/test_part_readme.py keeps every committed one equal to its rendering).

    python -m study readmes [--study referee crossover] [--part NAME ...]
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

from analysis.stats import LEVEL
from study import definition as defs
from study.results import read_csv
from study.tables import commits

ROOT = Path(__file__).resolve().parent.parent
STUDIES = ("referee", "crossover")


def p_text(p: float) -> str:
    from study.findings.family import p_text as text

    return text(p)


def _family(root: Path) -> list[dict]:
    from study.findings.family import family

    return family(root / "results" / "referee", root / "results" / "crossover")


def claims_of(study: str, part: str, tests: list[dict]) -> list[dict]:
    """The family's tests that speak of ``part``: its own pairs and switches (the referee's
    parts), its batch's pairs (a crossover cell), or the anatomy's steps with an arm in it."""
    if study == "referee":
        prefix = f"{part}: "
        return [t for t in tests if t["test"].startswith(prefix)]
    if study == "crossover":
        from study.findings.correction import steps

        mine = {f"{s.group}: {s.label}" for s in steps() if part in (s.before.part, s.after.part)}
        return [t for t in tests
                if t["test"].startswith(f"crossover {part}: ") or t["test"] in mine]  # fmt: skip
    return []


def cells(rows: list[dict]) -> list[str]:
    """Per cell and optimizer: the chosen lr, the evaluation seeds, their mean (sd) and how many
    collapsed."""
    out = ["| model | budget | batch (bytes) | optimizer | lr | evaluation seeds | final loss, "
           "mean (sd) | collapsed |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    groups: dict = {}
    for r in rows:
        if r.get("role") == "eval" and r.get("chosen", 1.0) == 1.0:
            key = (r["model"], r["budget"], r.get("batch_tokens"), r["optimizer"])
            groups.setdefault(key, []).append(r)
    for (model, budget, batch, opt), rs in sorted(groups.items(), key=lambda kv: str(kv[0])):
        losses = [float(r["final_val_loss"]) for r in rs]
        finite = all(math.isfinite(x) for x in losses)
        sd = f" ({statistics.stdev(losses):.4f})" if len(losses) > 1 and finite else ""
        mean = f"{statistics.fmean(losses):.4f}{sd}" if finite else "diverged"
        lrs = sorted({float(r["lr"]) for r in rs if r.get("lr") not in (None, "")})
        gone = sum(int(r.get("collapsed") or 0) for r in rs)
        batch_text = f"{int(batch):,}" if isinstance(batch, float) else "-"
        out.append(f"| {model} | {budget:g}x | {batch_text} | {opt} | "
                   f"{', '.join(f'{x:g}' for x in lrs) or '-'} | {len(rs)} | {mean} | {gone} |")  # fmt: skip
    return out


def render(study: str, part: defs.Part, tests: list[dict], root: Path = ROOT) -> str:
    """The part's README from its published folder (``part.results``) alone."""
    folder = root / part.results
    rows = read_csv(folder / "results.csv") if (folder / "results.csv").is_file() else []
    question = part.values.get("description") or (
        f"(no description: add one to study/studies/{study}.yaml's part {part.name})"
    )
    roles = {role: sum(r.get("role") == role for r in rows) for role in ("select", "eval")}
    lines = [f"# {study}/{part.name} (rendered by `python -m study readmes`)", "",
             " ".join(str(question).split()), "",
             f"Ledger: [results.csv](results.csv), {len(rows)} runs ({roles['select']} "
             f"selection, {roles['eval']} evaluation); its report: [report.md](report.md). "
             f"Run or continued with `python -m study run {study} --part {part.name}`.", ""]  # fmt: skip
    if rows:
        lines += ["## The cells (chosen values, evaluation seeds)", "", *cells(rows), ""]
    claims = claims_of(study, part.name, tests)
    alpha = 1 - LEVEL
    lines += ["## Its claims in the study's one family", ""]
    if claims:
        lines += [f"Each a paired difference (second named minus first) over the evaluation seeds, "
                  f"{LEVEL:.0%} t-interval, Holm over all {len(tests)} tests of the family "
                  "([results/referee/family.md](../../referee/family.md)).", "",
                  "| test | difference [interval] | Holm p | holds |", "|---|---|---|---|"]  # fmt: skip
        for t in sorted(claims, key=lambda t: t["test"]):
            lines.append(f"| {t['test']} | {t['mean']:+.4f} [{t['lo']:+.4f}, {t['hi']:+.4f}] | "
                         f"{p_text(t['holm_p'])} | {'yes' if t['holm_p'] <= alpha else 'no'} |")  # fmt: skip
    else:
        lines.append(
            "None yet (a part joins the family when its arms have finished their "
            "evaluation seeds, in float32 for the crossover)."
        )
    figures = sorted(p.name for p in folder.glob("*.png"))
    if figures:
        lines += ["", "## Figures", "", *(f"- [{f}]({f})" for f in figures)]
    if rows:
        lines += ["", "## Provenance", "", *commits(rows)]
    return "\n".join(lines) + "\n"


def parts_of(study: str, wanted: list[str] | None = None) -> list[defs.Part]:
    """The study's parts that have a published ledger (``wanted``: those alone)."""
    d = defs.load(study)
    return [p for name, p in d.parts.items() if (not wanted or name in wanted)
            and (ROOT / p.results / "results.csv").is_file()]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m study readmes", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--study", nargs="+", default=list(STUDIES), choices=STUDIES)
    ap.add_argument("--part", nargs="+", default=None)
    args = ap.parse_args(argv)
    tests = _family(ROOT)
    for study in args.study:
        for part in parts_of(study, args.part):
            path = ROOT / part.results / "README.md"
            path.write_text(render(study, part, tests))
            print(path.relative_to(ROOT))
    return 0
