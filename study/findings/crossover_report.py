"""The batch crossover's report (study/studies/crossover.yaml, `python -m study run crossover`): per batch, the correction's effect
``Delta_gamma(B) = L(MARS-AdamW) - L(MARS-AdamW, gamma = 0)`` and MARS-AdamW minus AdamW, each
the mean over the evaluation seeds of the paired per-seed differences with its 90% t-interval,
Holm-adjusted over the batches measured (one family per comparison), beside the crossover that
the gradient statistics predict (study/findings/predict.py's records, ``predict*.json``).

    python -m study crossover report      # RESULTS/report.md and RESULTS/crossover.png

Reads only the published files: each batch's ledger (``RESULTS/b<B>/results.csv`` for
proxy-100k, ``RESULTS/m<SIZE>-b<B>/`` for another proxy, e.g. ``m423k-b8192``: the chosen
evaluation runs of each arm), a check part's (``b<B>-fp32``: the cell again in float32, listed
beside the cell's runs) and the prediction records. A batch whose three arms have not all
finished their evaluation seeds is listed as running, with what it holds so far. Each proxy is
its own family for Holm.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import NamedTuple

from analysis.stats import LEVEL, holm, paired_interval, paired_p_value
from study.figures import crossover_figure
from study.findings.prediction_score import predicted_lines, predictions, scored, scored_lines
from study.results import read_csv
from study.tables import eval_losses

MARS, OFF, ADAMW = "mars-adamw", "mars-adamw:gamma=0", "adamw"
ARMS = [ADAMW, MARS, OFF]
COMPARISONS = [("Delta_gamma: MARS-AdamW - (gamma = 0)", OFF, MARS),
               ("MARS-AdamW - AdamW", ADAMW, MARS)]  # fmt: skip


HEADLINE_MODEL = "proxy-100k"
_FOLDER = re.compile(r"(?:m(?P<size>\d+k)-)?b(?P<batch>\d+)")


class Cell(NamedTuple):
    """One crossover cell: a proxy at a batch (bytes a step), 966 steps."""

    model: str
    batch: int

    @property
    def folder(self) -> str:
        """Its part's name and folder: ``b<B>`` for proxy-100k, ``m<SIZE>-b<B>`` for another."""
        size = self.model.removeprefix("proxy-")
        return f"b{self.batch}" if self.model == HEADLINE_MODEL else f"m{size}-b{self.batch}"

    @property
    def label(self) -> str:
        return (
            f"{self.batch:,}" if self.model == HEADLINE_MODEL else f"{self.batch:,} ({self.model})"
        )

    @staticmethod
    def of(name: str) -> Cell | None:
        """The cell a part's name is (None: not a cell, e.g. the check ``b131072-fp32``)."""
        m = _FOLDER.fullmatch(name)
        if m is None:
            return None
        model = f"proxy-{m['size']}" if m["size"] else HEADLINE_MODEL
        return Cell(model, int(m["batch"]))


def _cells(cells: list) -> list[Cell]:
    """Cells in report order (proxy-100k first, then by model, each by batch); a bare batch is
    proxy-100k's."""
    out = {c if isinstance(c, Cell) else Cell(HEADLINE_MODEL, int(c)) for c in cells}
    return sorted(out, key=lambda c: (c.model != HEADLINE_MODEL, c.model, c.batch))


def batch_losses(results: Path, cells: list) -> dict[Cell, dict[str, dict[int, float]]]:
    """``{cell: {arm: {seed: loss}}}`` of the chosen evaluation runs each ledger holds."""
    out = {}
    for b in _cells(cells):
        path = results / b.folder / "results.csv"
        if not path.is_file():
            continue
        losses = eval_losses(read_csv(path))
        out[b] = {opt: seeds for (opt, _m, _budget), seeds in losses.items()}
    return out


def collapsed_seeds(results: Path, cells: list) -> dict[Cell, dict[str, set[int]]]:
    """``{cell: {arm: {seed, ...}}}``: the chosen evaluation runs that collapsed (the ledger's
    ``collapsed`` column: the floor, divergence or a runaway training loss, study/curves.py)."""
    out: dict[Cell, dict[str, set[int]]] = {}
    for b in _cells(cells):
        path = results / b.folder / "results.csv"
        if not path.is_file():
            continue
        for r in read_csv(path):
            if r.get("role") == "eval" and r.get("chosen", 1.0) == 1.0 and r.get("collapsed"):
                out.setdefault(b, {}).setdefault(str(r["optimizer"]), set()).add(int(r["seed"]))
    return out


def fp32_checks(results: Path, cells: list) -> list[dict]:
    """Each evaluation run of a check part ``<cell>-fp32`` (the cell's chosen lrs on its
    evaluation seeds again, in float32) beside the cell's own run of that arm and seed: both
    losses, whether each collapsed, and where each ran (``ran_on``). Only runs the check has
    finished."""
    rows = []
    for b in _cells(cells):
        check, own = (
            results / f"{b.folder}-fp32" / "results.csv",
            results / b.folder / "results.csv",
        )
        if not (check.is_file() and own.is_file()):
            continue

        def runs(path: Path) -> dict[tuple[str, int], dict]:
            return {(str(r["optimizer"]), int(r["seed"])): r for r in read_csv(path)
                    if r.get("role") == "eval" and r.get("chosen", 1.0) == 1.0
                    and r.get("final_val_loss") not in (None, "")}  # fmt: skip

        mine, theirs = runs(own), runs(check)
        order = sorted(theirs, key=lambda k: (ARMS.index(k[0]) if k[0] in ARMS else len(ARMS), k))
        for arm, seed in order:
            r, o = theirs[(arm, seed)], mine.get((arm, seed))
            rows.append({"cell": b, "arm": arm, "seed": seed,
                         "loss": float(r["final_val_loss"]), "collapsed": bool(r.get("collapsed")),
                         "ran_on": ran_on(r),
                         "cell_loss": float(o["final_val_loss"]) if o else math.nan,
                         "cell_collapsed": bool(o.get("collapsed")) if o else False,
                         "cell_ran_on": ran_on(o) if o else "-"})  # fmt: skip
    return rows


def trained_pairs(losses: dict, collapsed: dict) -> list[dict]:
    """Each comparison at each batch on the evaluation seeds where neither run collapsed: the
    number of such pairs and their per-seed differences (a description, not a test: which seeds
    survive is itself an outcome). Only where some pair was left out."""
    rows = []
    for name, base, other in COMPARISONS:
        for b in _cells(list(losses)):
            a, o = losses[b].get(base, {}), losses[b].get(other, {})
            gone = collapsed.get(b, {}).get(base, set()) | collapsed.get(b, {}).get(other, set())
            both = sorted(set(a) & set(o))
            if not both or not gone & set(both):
                continue
            kept = [s for s in both if s not in gone]
            rows.append({"comparison": name, "cell": b, "batch": b.batch, "seeds": kept,
                         "diffs": [o[s] - a[s] for s in kept], "left_out": len(both) - len(kept)})  # fmt: skip
    return rows


SELECTION_SEEDS = (0, 6, 7)


def selection(results: Path, cells: list) -> dict[Cell, dict[str, dict]]:
    """``{cell: {arm: {lr, mean, lrs, device}}}``: while evaluation runs are missing, each arm's
    best lr so far among those run on all three selection seeds (the mean over them, the lrs
    so measured) and where the batch's runs ran (the ledger's device column, else the CPU's)."""
    out: dict[Cell, dict[str, dict]] = {}
    for b in _cells(cells):
        path = results / b.folder / "results.csv"
        if not path.is_file():
            continue
        by: dict[tuple[str, float], dict[int, float]] = {}
        where: dict[str, set[str]] = {}
        for r in read_csv(path):
            if r.get("role") != "select" or r.get("final_val_loss") in (None, ""):
                continue
            opt = str(r["optimizer"])
            by.setdefault((opt, float(r["lr"])), {})[int(r["seed"])] = float(r["final_val_loss"])
            where.setdefault(opt, set()).add(ran_on(r))
        for (opt, lr), seeds in by.items():
            if not set(SELECTION_SEEDS) <= set(seeds):
                continue
            mean = sum(seeds[s] for s in SELECTION_SEEDS) / len(SELECTION_SEEDS)
            arm = out.setdefault(b, {}).setdefault(opt, {"lr": lr, "mean": mean, "lrs": 0})
            arm["lrs"] += 1
            if mean < arm["mean"]:
                arm.update(lr=lr, mean=mean)
            arm["device"] = "; ".join(sorted(where[opt]))
    return out


STEPS = 966  # every cell's steps (the headline's)


def epochs_of(results: Path, cells: list) -> dict:
    """``{cell: epochs}``: the tokens a run of the cell trains on (966 steps of its batch) over
    the tokens one epoch of the corpus holds (RESULTS/corpus.json, ``python -m study crossover
    corpus``); empty without that record. Keyed as given (a Cell or a bare batch)."""
    path = results / "corpus.json"
    if not path.is_file():
        return {}
    epoch = int(json.loads(path.read_text())["epoch_tokens"])
    return {c: STEPS * (c.batch if isinstance(c, Cell) else int(c)) / epoch for c in cells}


def arithmetic(rows: list[dict]) -> str:
    """The arithmetic a cell's chosen evaluation runs ran in: ``float32`` when every one did
    (``ran_on``), else what the others ran (``bf16``: the cell is no measurement of the
    comparison, docs/study.md)."""
    kinds = {ran_on(r).rsplit(", ", 1)[-1] for r in rows
             if r.get("role") == "eval" and r.get("chosen", 1.0) == 1.0}  # fmt: skip
    other = sorted(k for k in kinds if k != "float32")
    return "float32" if not other else ", ".join(other)


def void_cells(results: Path, cells: list) -> dict:
    """``{cell: arithmetic}`` of the cells whose evaluation runs did not all run float32: not
    measured yet (the 131,072-byte cell ran bf16 autocast, and a third of its evaluation runs
    collapsed); their tests are left out of the table, the figure and the family."""
    out = {}
    for b in _cells(cells):
        path = results / b.folder / "results.csv"
        if path.is_file():
            kind = arithmetic(read_csv(path))
            if kind != "float32":
                out[b] = kind
    return out


def ran_on(row: dict) -> str:
    """Where a ledger row ran and in what arithmetic: its GPU (the ``device`` column) or CPU,
    with the dtype (the row's ``dtype`` column; else the ``dtype=`` its command set; else the
    default: bf16 autocast on a GPU, float32 on a CPU)."""
    gpu = row.get("device")
    dtype = row.get("dtype")
    if not dtype:
        said = [a.split("=", 1)[1] for a in str(row.get("command") or "").split()
                if a.startswith("dtype=")]  # fmt: skip
        dtype = said[-1] if said else ("auto" if gpu else "float32")
    if gpu:
        from study.results import gpu_dtype

        dtype = gpu_dtype(str(dtype))
    return f"{gpu or row.get('cpu') or '?'}, {dtype}"


def effects(losses: dict, n_seeds: int = 5, void: dict | None = None) -> list[dict]:
    """Every comparison at every batch where both arms have all ``n_seeds`` evaluation seeds
    and which is no ``void`` cell: the paired interval, the p-value, and the Holm-adjusted p
    over that comparison's batches (one family per comparison and proxy)."""
    losses = {c: v for c, v in losses.items() if c not in (void or {})}
    rows = []
    models = sorted({c.model for c in losses}, key=lambda m: (m != HEADLINE_MODEL, m))
    for name, base, other in COMPARISONS:
        for model in models:
            family = []
            for b in _cells([c for c in losses if c.model == model]):
                a, o = losses[b].get(base, {}), losses[b].get(other, {})
                if len(set(a) & set(o)) < n_seeds:
                    continue
                iv = paired_interval(a, o)
                family.append({"comparison": name, "cell": b, "batch": b.batch, "model": model,
                               "mean": iv.mean, "lo": iv.lo, "hi": iv.hi, "n": iv.n,
                               "p": paired_p_value(a, o)})  # fmt: skip
            for row, adj in zip(family, holm([r["p"] for r in family])):
                row["holm_p"] = adj
            rows += family
    return rows


def markdown(
    losses: dict,
    rows: list[dict],
    preds: list[dict],
    batches: list,
    picked: dict | None = None,
    collapsed: dict | None = None,
    checks: list[dict] | None = None,
    void: dict | None = None,
    epochs: dict | None = None,
    score: list[dict] | None = None,
) -> str:
    cells = _cells(batches)
    pct = f"{LEVEL:.0%}"
    lines = ["# The batch crossover (`python -m study run crossover`)", "",
             "proxy-100k (and where named another proxy), 966 steps at every batch; per batch, "
             "each arm's lr tuned on its own line (selection seeds 0, 6, 7), the other knobs "
             "carried from the referee's batch part (another proxy: from its cell of the size "
             "ladder); evaluation seeds 1-5. Differences are paired per seed; Holm over the "
             "batches of each comparison and proxy.", "", "## Measured", "",
             f"| comparison | batch (bytes) | mean [{pct} t-interval] | p | Holm p (this report) |",
             "|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['comparison']} | {r['cell'].label} | {r['mean']:+.4f} [{r['lo']:+.4f}, "
                     f"{r['hi']:+.4f}] | {r['p']:.2g} | {r['holm_p']:.2g} |")  # fmt: skip
    void, epochs = void or {}, epochs or {}
    for b, kind in void.items():
        lines.append(f"| every comparison | {b.label} | not measured yet ({kind} arithmetic; "
                     "float32 rerun pending) | - | - |")  # fmt: skip
    lines += [
        "",
        "The Holm p above corrects within this report; the study's one family "
        "(results/referee/family.md) corrects over every test the study reports.",
    ]
    collapsed = collapsed or {}
    lines += ["", "Evaluation seeds finished per arm, with how many of them collapsed (a batch "
              "without all three arms' five is still running: the same `python -m study run "
              "crossover` continues it), and the epochs a run makes over the training corpus "
              "(966 steps of the batch over the tokens one epoch of windows holds, "
              "results/crossover/corpus.json; past 1, the runs see their data again):", "",
              "| batch | " + " | ".join(a for _, a, _ in [("", ADAMW, 0), ("", MARS, 0),
                                                          ("", OFF, 0)]) + " | complete | epochs |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for b in cells:
        arms = losses.get(b, {})
        gone = collapsed.get(b, {})
        counts = [str(len(arms.get(a, {}))) + (f" ({len(gone[a])} collapsed)" if gone.get(a) else "")
                  for a in ARMS]  # fmt: skip
        whole = all(len(arms.get(a, {})) >= 5 for a in ARMS)  # every arm's five
        state = f"no: {void[b]}, not measured yet" if b in void else "yes" if whole else "no"
        ep = f"{epochs[b]:.2f}" if b in epochs else "-"
        lines.append(f"| {b.label} | " + " | ".join(counts) + f" | {state} | {ep} |")
    pairs = trained_pairs(losses, collapsed)
    if pairs:
        lines += ["", "## Where both runs of a pair trained (a description, not a test)", "",
                  "The same comparisons on the evaluation seeds where neither run collapsed. Which "
                  "seeds survive is itself an outcome, so these are no tests and are not in the "
                  "Holm family; they say what the collapses hide.", "",
                  "| comparison | batch (bytes) | pairs (seeds) | per-seed differences | mean |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for r in pairs:
            diffs = ", ".join(f"{d:+.4f}" for d in r["diffs"]) or "-"
            mean = f"{sum(r['diffs']) / len(r['diffs']):+.4f}" if r["diffs"] else "-"
            lines.append(f"| {r['comparison']} | {r['cell'].label} | {len(r['seeds'])} "
                         f"({', '.join(map(str, r['seeds']))}) | {diffs} | {mean} |")  # fmt: skip
    if checks:
        lines += ["", "## The float32 checks (a description, not a test)", "",
                  "A check part (`b131072-fp32`) runs a cell's chosen lrs on its evaluation seeds "
                  "again in float32 (TF32 matmuls on a GPU), beside the cell's own run of the same "
                  "arm and seed: a seed that collapsed in bf16 and trains in float32 points to the "
                  "arithmetic. Only the check's finished runs are listed.", "",
                  "| batch | arm | seed | the cell's run | ran on | float32 check | ran on |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip

        def reading(loss: float, gone: bool) -> str:
            return "-" if math.isnan(loss) else f"{loss:.4f}" + (" (collapsed)" if gone else "")

        for r in checks:
            lines.append(f"| {r['cell'].label} | {r['arm']} | {r['seed']} | "
                         f"{reading(r['cell_loss'], r['cell_collapsed'])} | {r['cell_ran_on']} | "
                         f"{reading(r['loss'], r['collapsed'])} | {r['ran_on']} |")  # fmt: skip
    if picked:
        lines += ["", "## On the selection seeds so far", "",
                  "Each arm's best lr among those run on all three selection seeds (0, 6, 7), the "
                  "mean loss over them, and how many lrs were so measured: the tuning, not the "
                  "comparison (that is the evaluation seeds', above). A GPU row and a CPU row of one "
                  "cell share a comparison only statistically.", "",
                  "| batch | arm | lr | mean over 0, 6, 7 | lrs on all three | ran on |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for b in _cells(list(picked)):
            arms = picked[b]
            for arm in ARMS:
                if arm in arms:
                    a = arms[arm]
                    lines.append(f"| {b.label} | {arm} | {a['lr']:g} | {a['mean']:.4f} | {a['lrs']} "
                                 f"| {a['device']} |")  # fmt: skip
    lines += ["", "## Predicted (python -m study predict)", "", *predicted_lines(preds)]
    if score:
        hits = sum(r["hit"] for r in score)
        lines += ["", "## The prediction, scored", "",
                  "Each measured cell against each record's run of the optimizer whose trajectory "
                  "the correction acts in (MARS-AdamW for Delta_gamma; AdamW for Delta_corr, in "
                  "results/crossover/correction.md), at its last phase: predicted to help at or past its crossover; measured to help "
                  f"where the {pct} interval lies below 0. {hits} of {len(score)} hit. "
                  "predict-headline.json probed the headline's runs (other knobs and lrs than "
                  "the crossover's arms), predict-crossover-*.json the crossover's own arms at "
                  "their chosen lrs: the predictor is an instrument here, not a claim.", "",
                  *scored_lines(score)]  # fmt: skip
    return "\n".join(lines) + "\n"


def write(results: Path, batches: list) -> Path:
    """RESULTS/report.md and RESULTS/crossover.png from the published files."""
    results.mkdir(parents=True, exist_ok=True)
    losses, void = batch_losses(results, batches), void_cells(results, batches)
    rows, preds = effects(losses, void=void), predictions(results)
    picked, collapsed = selection(results, batches), collapsed_seeds(results, batches)
    checks = fp32_checks(results, batches)
    epochs = {c: e for c, e in epochs_of(results, _cells(batches)).items()
              if c.model == HEADLINE_MODEL}  # fmt: skip
    score = scored(preds, [r for r in rows if r["model"] == HEADLINE_MODEL])
    (results / "report.md").write_text(
        markdown(losses, rows, preds, batches, picked, collapsed, checks, void, epochs, score)
    )
    crossover_figure(rows, preds, results / "crossover.png", COMPARISONS, HEADLINE_MODEL)
    return results / "report.md"
