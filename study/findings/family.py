"""One Holm correction over every test the study reports (docs/study.md, "One family"): each
report corrects within itself, so a difference that holds in its own report may not hold once
every test of the study is counted. This gathers, from the committed ledgers alone:

- **pairs**: in every comparison cell of every part, every pair of optimizers (the reports'
  pairs: paired t over the evaluation seeds);
- **factorial**: each of MARS-AdamW's single switches (betas, gamma, the gains' weight decay,
  all three, exact mode, the 8,192 batch) against MARS-AdamW, paired;
- **across cells**: for every optimizer, the change of its gap to AdamW between two cells the
  study compares (0.25x -> 1x; default -> width-aware init; 2,048 -> 8,192 bytes; each step up
  the size ladder), paired per seed;
- **the batch crossover** (results/crossover/b<B>/ and m<SIZE>-b<B>/, ``--crossover``): in every
  batch whose arms have all finished their evaluation seeds in float32, every pair of its arms
  (``Delta_gamma`` among them; a cell that ran in another arithmetic, the 131,072-byte cell's
  bf16, is not measured yet and adds no test);
- **the correction's anatomy** (study/findings/correction.py): the correction on AdamW's configuration at
  each batch, the chain from AdamW to MARS-AdamW one value at a time, the parts of the
  correction, each step whose two arms have finished their evaluation seeds;

and adjusts all of their p-values together (Holm, family-wise level 0.10, the intervals' level).

    python -m study family [--results results/referee] [--crossover results/crossover]
                           [--out results/referee/family.md] [--docs docs/study.md]

``--docs`` also rewrites the conclusions table of docs/study.md (between
``<!-- conclusions: ... -->`` and ``<!-- end -->``): each conclusion the docs draw, its tests'
differences and Holm p in this family, so none of them is typed by hand (tests/test_correction_arms.py).
"""

from __future__ import annotations

import argparse
import re
from itertools import combinations
from pathlib import Path

from analysis.stats import LEVEL, holm, paired_interval, paired_p_value
from study.results import read_csv
from study.tables import BASELINE, eval_losses
from study.variant import Variant

ROOT = Path(__file__).resolve().parents[2]
PARTS = ["headline", "ladder", "ladder-up", "widthinit", "batch", "factorial"]
# (name, (part, model, budget) before, (part, model, budget) after)
ACROSS = [
    ("budget 0.25x -> 1x", ("ladder", "proxy-100k", 0.25), ("headline", "proxy-100k", 1.0)),
    ("init default -> width-aware", ("ladder", "proxy-100k", 0.25),
     ("widthinit", "proxy-100k", 0.25)),
    ("batch 2,048 -> 8,192", ("headline", "proxy-100k", 1.0), ("batch", "proxy-100k", 1.0)),
    ("size 100k -> 193k", ("ladder", "proxy-100k", 0.25), ("ladder-up", "proxy-193k", 0.25)),
    ("size 193k -> 423k", ("ladder-up", "proxy-193k", 0.25), ("ladder-up", "proxy-423k", 0.25)),
]  # fmt: skip


def own_losses(path: Path, *, merged: bool = False) -> dict:
    """``{(optimizer, model, budget): {seed: loss}}`` of a ledger's own chosen evaluation runs
    (cells merged from another part are that part's tests; ``merged``: keep them, for the
    factorial, whose all-MARS corner is the headline's MARS-AdamW cell)."""
    rows = [r for r in read_csv(path)
            if merged or str(r.get("run_dir", "")).startswith("runs/")]  # fmt: skip
    return eval_losses(rows)


def _test(kind: str, name: str, base: dict, other: dict) -> dict | None:
    if len(set(base) & set(other)) < 2:
        return None
    iv = paired_interval(base, other)
    return {"kind": kind, "test": name, "mean": iv.mean, "lo": iv.lo, "hi": iv.hi,
            "p": paired_p_value(base, other)}  # fmt: skip


def pair_tests(losses: dict[str, dict]) -> list[dict]:
    out = []
    for part, cells in losses.items():
        if part == "factorial":
            continue
        for model, budget in sorted({(m, b) for (_o, m, b) in cells}):
            opts = sorted(o for (o, m, b) in cells if (m, b) == (model, budget))
            for a, b in combinations(opts, 2):
                t = _test("pair", f"{part}: {model} {budget:g}x: {b} - {a}",
                          cells[(a, model, budget)], cells[(b, model, budget)])  # fmt: skip
                if t:
                    out.append(t)
    return out


def factorial_tests(cells: dict) -> list[dict]:
    """Each corner of the factorial against MARS-AdamW's own cell (the switch's effect)."""
    base = {k: v for k, v in cells.items() if k[0] == "mars-adamw"}
    if not base:
        return []
    (_o, model, budget), mars = next(iter(base.items()))
    out = []
    for (opt, m, b), seeds in sorted(cells.items()):
        variant = Variant.parse(opt)
        if (m, b) == (model, budget) and variant.base == "mars-adamw" and variant.options:
            t = _test("factorial", f"factorial: {opt} - mars-adamw", mars, seeds)
            if t:
                out.append(t)
    return out


def gap(cells: dict, opt: str, model: str, budget: float) -> dict | None:
    o, a = cells.get((opt, model, budget)), cells.get((BASELINE, model, budget))
    if not o or not a:
        return None
    return {s: o[s] - a[s] for s in set(o) & set(a)}


def across_tests(losses: dict[str, dict]) -> list[dict]:
    out = []
    for name, (pa, ma, ba), (pb, mb, bb) in ACROSS:
        if pa not in losses or pb not in losses:
            continue
        opts = {o for (o, m, b) in losses[pa] if (m, b) == (ma, ba)} & {
            o for (o, m, b) in losses[pb] if (m, b) == (mb, bb)
        }
        for opt in sorted(opts - {BASELINE}):
            before, after = gap(losses[pa], opt, ma, ba), gap(losses[pb], opt, mb, bb)
            if before and after:
                t = _test("across", f"{name}: {opt}'s gap to AdamW", before, after)
                if t:
                    out.append(t)
    return out


def crossover_losses(folder: Path | None, n_seeds: int = 5) -> dict[str, dict]:
    """``{"crossover b<B>": cells}`` of the crossover's batches whose three arms (AdamW,
    MARS-AdamW, gamma = 0) all have ``n_seeds`` evaluation seeds (a batch still running adds no
    test, even where one arm has finished)."""
    from study.findings.crossover_report import ADAMW, MARS, OFF, Cell, arithmetic

    found = {}
    for path in sorted(folder.glob("*/results.csv")) if folder and folder.is_dir() else []:
        cell = Cell.of(path.parent.name)  # (None: a check such as b131072-fp32, not a batch)
        if cell is None or arithmetic(read_csv(path)) != "float32":
            continue
        cells = own_losses(path)
        arms = {arm for (arm, _, _), seeds in cells.items() if len(seeds) >= n_seeds}
        if {ADAMW, MARS, OFF} <= arms:
            found[cell] = cells
    order = sorted(found, key=lambda c: (c.model != "proxy-100k", c.model, c.batch))
    return {f"crossover {c.folder}": found[c] for c in order}


def family(results: Path, crossover: Path | None = None) -> list[dict]:
    """Every test, with its Holm p over all of them (``holm_p``)."""
    losses = {p: own_losses(results / p / "results.csv", merged=p == "factorial") for p in PARTS
              if (results / p / "results.csv").is_file()}  # fmt: skip
    losses.update(crossover_losses(crossover))
    tests = pair_tests(losses) + factorial_tests(losses.get("factorial", {})) + across_tests(losses)
    if crossover is not None and crossover.is_dir():
        from study.findings.correction import family_tests

        tests += family_tests(crossover)
    for t, adj in zip(tests, holm([t["p"] for t in tests])):
        t["holm_p"] = adj
    return tests


_MU = "(muon|mars-m|moonlight)"
# (conclusion, the tests it rests on: regular expressions over the tests' names, each matched whole)
CONCLUSIONS = [
    ("MARS-AdamW behind AdamW at proxy-100k 1x, 2,048 bytes (the headline)",
     [r"headline: proxy-100k 1x: mars-adamw - adamw"]),
    ("MARS-AdamW behind AdamW at 1x, 8,192 bytes, both tuned anew",
     [r"batch: proxy-100k 1x: mars-adamw - adamw"]),
    ("MARS-AdamW behind AdamW at 0.25x: proxy-100k, -193k",
     [r"ladder: proxy-100k 0.25x: mars-adamw - adamw", r"ladder-up: proxy-193k 0.25x: mars-adamw - adamw"]),
    ("MARS-AdamW behind AdamW at proxy-423k 0.25x", [r"ladder-up: proxy-423k 0.25x: mars-adamw - adamw"]),
    ("the Muon family ahead of AdamW in every cell",
     [rf"(headline|ladder|ladder-up|widthinit): .*: {_MU} - adamw"]),
    ("MARS-M behind Moonlight at 1x", [r"headline: proxy-100k 1x: moonlight - mars-m"]),
    ("MARS-M behind Muon at 1x", [r"headline: proxy-100k 1x: muon - mars-m"]),
    ("the 4x batch narrows MARS-AdamW's gap", [r"batch 2,048 -> 8,192: mars-adamw's gap to AdamW"]),
    ("MARS-AdamW's gap grows from 0.25x to 1x", [r"budget 0.25x -> 1x: mars-adamw's gap to AdamW"]),
    ("the Muon family's lead changes from 0.25x to 1x", [rf"budget 0.25x -> 1x: {_MU}'s gap to AdamW"]),
    ("the Muon family's lead changes from proxy-193k to -423k",
     [rf"size 193k -> 423k: {_MU}'s gap to AdamW"]),
    ("any gap moves with the width-aware initialisation", [r"init default -> width-aware: .*"]),
    ("any gap moves from proxy-100k to -193k", [r"size 100k -> 193k: .*"]),
    ("a single factorial switch alone (gamma; betas with kappa free or held; the gains' decay; "
     "exact mode)",
     [r"factorial: mars-adamw:gamma=0\.0,betas=\[0\.95,0\.99\],weight_decay_1d=0\.1 - mars-adamw",
      r"factorial: mars-adamw:gamma=0\.025,betas=\[0\.9,0\.95\],weight_decay_1d=0\.1 - mars-adamw",
      r"factorial: mars-adamw:gamma=0\.0528,betas=\[0\.9,0\.95\],weight_decay_1d=0\.1 - mars-adamw",
      r"factorial: mars-adamw:gamma=0\.025,betas=\[0\.95,0\.99\],weight_decay_1d=0\.0 - mars-adamw",
      r"factorial: mars-adamw:mode=exact - mars-adamw"]),
    ("all three factorial switches together",
     [r"factorial: mars-adamw:gamma=0\.0,betas=\[0\.9,0\.95\],weight_decay_1d=0\.0 - mars-adamw"]),
    ("the factorial's untuned 8,192 batch", [r"factorial: mars-adamw:batch_tokens=8192 - mars-adamw"]),
    ("crossover: switching the correction off at MARS-AdamW's defaults (gamma = 0 minus "
     "MARS-AdamW), 2,048, 8,192, 32,768 bytes",
     [rf"crossover b{b}: proxy-100k {b // 2048}x: mars-adamw:gamma=0 - mars-adamw"
      for b in (2048, 8192, 32768)]),
    ("crossover: MARS-AdamW behind AdamW at 2,048, 8,192, 32,768 bytes, 966 steps",
     [rf"crossover b{b}: proxy-100k {b // 2048}x: mars-adamw - adamw" for b in (2048, 8192, 32768)]),
    ("crossover: gamma = 0 behind AdamW at 2,048, 8,192, 32,768 bytes",
     [rf"crossover b{b}: proxy-100k {b // 2048}x: mars-adamw:gamma=0 - adamw"
      for b in (2048, 8192, 32768)]),
    ("the correction on AdamW's own configuration (AdamW + correction minus AdamW), by batch",
     [r"correction: .*"]),
    ("MARS-AdamW's defaults one at a time from AdamW (A1-A4), and its second moment from g",
     [r"chain: A\d.*", r"chain: MARS-AdamW .*"]),
    ("the gains' decay (A1) at 8,192 bytes", [r"chain: 8,192 B: A1.*"]),
    ("MARS-AdamW without the gains' decay against MARS-AdamW and against AdamW, 2,048 bytes",
     [r"chain: 2,048 B: MARS-AdamW without .*"]),
    ("MARS-AdamW without the gains' decay against MARS-AdamW and against AdamW, 8,192 bytes",
     [r"chain: 8,192 B: MARS-AdamW without .*"]),
    ("the correction's parts at 2,048 bytes: half strength minus AdamW, no clip minus the clip",
     [r"parts of the correction: .*"]),
]  # fmt: skip
DOCS_MARK = re.compile(r"(<!-- conclusions: [^\n]*-->\n)(.*?)(<!-- end -->)", re.S)
ANATOMY_MARK = re.compile(r"(<!-- anatomy: [^\n]*-->\n)(.*?)(<!-- end -->)", re.S)


def anatomy(crossover: Path, tests: list[dict]) -> str:
    """docs/study.md's reading of the correction's anatomy (study/findings/correction.py ``reading``)
    with each step's Holm p over ``tests``, the family."""
    from study.findings.correction import reading

    return reading(crossover, {t["test"]: t["holm_p"] for t in tests}, p_text)


def p_text(p: float) -> str:
    """A p-value at two significant digits, or three where two would print the family-wise level
    itself for a value on the other side of it (0.1004 reads 0.1 and does not hold)."""
    text, alpha = f"{p:.2g}", 1 - LEVEL
    return f"{p:.3g}" if abs(float(text) - alpha) < 1e-12 and abs(p - alpha) > 1e-12 else text


def conclusions(tests: list[dict]) -> str:
    """The docs' conclusions table: each conclusion's tests (in the family's order), their
    differences and Holm p over every test, and whether they hold (all, none, or how many)."""
    alpha = 1 - LEVEL
    lines = [f"| conclusion | difference(s) | Holm p over the {len(tests)} | holds |",
             "|---|---|---|---|"]  # fmt: skip
    for text, patterns in CONCLUSIONS:
        got = [t for t in tests if any(re.fullmatch(p, t["test"]) for p in patterns)]
        if not got:
            lines.append(f"| {text} | not measured yet | - | - |")
            continue
        held = sum(t["holm_p"] <= alpha for t in got)
        holds = "yes" if held == len(got) else "no" if not held else f"{held} of {len(got)}"
        if len(got) > 4:  # many tests: their range and the largest Holm p
            means = [t["mean"] for t in got]
            diffs = f"{len(got)} tests, {min(means):+.3f} to {max(means):+.3f}"
            ps = f"{p_text(max(t['holm_p'] for t in got))} at most"
        else:
            diffs = ", ".join(f"{t['mean']:+.3f}" for t in got)
            ps = ", ".join(p_text(t["holm_p"]) for t in got)
        lines.append(f"| {text} | {diffs} | {ps} | {holds} |")
    return "\n".join(lines) + "\n"


def markdown(tests: list[dict]) -> str:
    alpha = 1 - LEVEL
    held = sum(t["holm_p"] <= alpha for t in tests)
    lines = [
        "# One family: every test of the study, one Holm correction (python -m study family)",
        "",
        f"{len(tests)} tests ({sum(t['kind'] == 'pair' for t in tests)} pairs within cells, "
        f"{sum(t['test'].startswith('crossover') for t in tests)} of them the batch crossover's; "
        f"{sum(t['kind'] == 'factorial' for t in tests)} factorial switches; "
        f"{sum(t['kind'] == 'across' for t in tests)} changes across cells; "
        f"{sum(t['kind'] == 'anatomy' for t in tests)} steps of the correction's anatomy); "
        f"{held} hold at "
        f"family-wise {alpha:.2f}. Differences are the second named minus the first (for "
        "changes: after minus before), paired over the evaluation seeds, "
        f"{LEVEL:.0%} t-intervals.",
        "",
        "| test | difference [interval] | p | Holm p (all tests) | holds |",
        "|---|---|---|---|---|",
    ]
    for t in sorted(tests, key=lambda t: (t["holm_p"], t["p"], t["test"])):
        lines.append(f"| {t['test']} | {t['mean']:+.4f} [{t['lo']:+.4f}, {t['hi']:+.4f}] | "
                     f"{t['p']:.2g} | {p_text(t['holm_p'])} | "
                     f"{'yes' if t['holm_p'] <= alpha else 'no'} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m study family", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--results", type=Path, default=ROOT / "results" / "referee")
    ap.add_argument("--crossover", type=Path, default=ROOT / "results" / "crossover",
                    help="the batch crossover's published batches (none: leave them out)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--docs", type=Path, default=None,
                    help="also rewrite this page's conclusions table (docs/study.md)")  # fmt: skip
    args = ap.parse_args(argv)
    tests = family(args.results, args.crossover)
    if not tests:
        raise SystemExit(f"study.family: no ledger with tests under {args.results}")
    text = markdown(tests)
    (args.out or args.results / "family.md").write_text(text)
    if args.docs is not None:
        page = args.docs.read_text()
        if not DOCS_MARK.search(page):
            raise SystemExit(f"{args.docs}: no '<!-- conclusions: ... -->' ... '<!-- end -->' "
                             "block to rewrite; add the two marker lines where the table goes")  # fmt: skip
        table = conclusions(tests)
        page = DOCS_MARK.sub(lambda m: m[1] + table + m[3], page, count=1)
        if ANATOMY_MARK.search(page) and args.crossover is not None:
            said = anatomy(args.crossover, tests)
            page = ANATOMY_MARK.sub(lambda m: m[1] + said + m[3], page, count=1)
        args.docs.write_text(page)
    print(text.split("\n\n")[1])
    return 0
