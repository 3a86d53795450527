"""The papers' tables and figures from finished (or still running) training runs.

    python -m report runs/owt/ 'runs/fw/*' --out reports/owt [--at-tokens auto|5e9,20e9,50e9]
        [--baseline adamw] [--title TEXT]

Arguments are run directories (``config.yaml`` + ``metrics.jsonl``), globs, parent directories
(searched recursively, e.g. a sweep's directory) or lm-eval-harness ``results_*.json`` files.
Writes into ``--out``: report.md (also printed), report.json (the same data), val_loss.csv,
downstream.csv (when any downstream result exists) and per (dataset, size) the figures
``val_loss_<dataset>_<size>_tokens.png`` and ``..._time.png``, and per dataset with runs at three
or more compute values ``loss_fit_<dataset>.png``. Published values come from docs/published.yaml.
Runs of an ablation set (configs/experiment/ablation*/) also get the ablation table
(report/ablations.py, docs/ablations.md).
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from evals import tasks as et
from report import ablations as abl
from report import runs as rr
from report import variants as ana
from report.render import render
from report.sections import build_report
from runtime import runfiles

PUBLISHED = Path(__file__).resolve().parent.parent / "docs" / "published.yaml"
REPORT_FILES = ("report.md", "report.json", "val_loss.csv", "downstream.csv")
FIGURE_PATTERNS = ("val_loss_*_tokens.png", "val_loss_*_time.png", "loss_fit_*.png")
SKIP_DIRS = {runfiles.CHECKPOINTS, "hf", runfiles.EVAL, "wandb", "__pycache__"}


# ---- finding runs ---------------------------------------------------------------------------


def find_runs(root: Path) -> list[Path]:
    """Run directories at or below ``root`` (not descending into a run or hidden folders)."""
    if runfiles.is_run_dir(root):
        return [root]
    found = []
    for dirpath, dirnames, _ in os.walk(root):
        here = Path(dirpath)
        if runfiles.is_run_dir(here):
            found.append(here)
            dirnames.clear()
            continue
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in SKIP_DIRS)
    return found


def expand(args: list[str], warnings: list[str]) -> tuple[list[Path], list[Path]]:
    """(run directories, lm-eval result files) named by the command-line arguments."""
    runs: dict[Path, None] = {}
    lm_files: list[Path] = []
    for arg in args:
        path = Path(arg).expanduser()
        matches = (
            [path] if path.exists() else sorted(map(Path, glob.glob(str(path), recursive=True)))
        )
        if not matches:
            raise SystemExit(
                f"report: {arg!r} matches no file or directory; give run directories, "
                "their parent directories, globs or lm-eval results_*.json files"
            )
        for m in matches:
            if m.is_dir():
                found = find_runs(m)
                if not found:
                    warnings.append(
                        f"skipped {m}: not a run directory ({runfiles.CONFIG} + "
                        f"{runfiles.METRICS}) and holds none"
                    )
                runs.update((p.resolve(), None) for p in found)
            elif m.suffix == ".json":
                lm_files.append(m.resolve())
            else:
                warnings.append(f"skipped {m}: not a directory or an lm-eval results JSON file")
    return list(runs), lm_files


def owner_run(lm_file: Path, run_dirs: list[Path]) -> Path | None:
    """The run an lm-eval file belongs to: the run it lies in, or whose files it evaluated."""
    evaluated = rr.lm_eval_model_path(lm_file)
    candidates = [lm_file] + ([Path(evaluated).expanduser().resolve()] if evaluated else [])
    for c in candidates:
        for run in run_dirs:
            if c == run or run in c.parents:
                return run
    return None


# ---- writing --------------------------------------------------------------------------------


def jsonable(value: Any) -> Any:
    """NaN/inf -> None, numpy scalars -> floats, recursively."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_csvs(report: dict[str, Any], out: Path) -> None:
    """val_loss.csv (one line per table cell) and downstream.csv (one per row), if any."""
    cols = [
        "dataset",
        "size",
        "optimizer",
        "column",
        "column_tokens",
        "mean",
        "std",
        "n_seeds",
        "reached",
        "paper",
        "paper_approximate",
        "diff",
    ]
    with open(out / "val_loss.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for sec in report["val_loss"]:
            for row in sec["rows"]:
                for c in row["cells"]:
                    w.writerow(
                        [sec["dataset"], c["size"], row["optimizer"]] + [c[k] for k in cols[3:]]
                    )
    if not any(not r["paper"] for sec in report["downstream"] for r in sec["rows"]):
        return  # no downstream result of ours
    with open(out / "downstream.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["dataset", "size", "optimizer", "paper", *et.TASKS, "avg", "source"])
        for sec in report["downstream"]:
            for r in sec["rows"]:
                w.writerow(
                    [
                        sec["dataset"],
                        sec["size"],
                        r["optimizer"],
                        r["paper"],
                        *(r["scores"].get(t) for t in et.TASKS),
                        r["avg"],
                        r["source"],
                    ]
                )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (``argv`` None: sys.argv)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "paths",
        nargs="+",
        metavar="RUN_DIR_OR_GLOB",
        help="run directories, their parents, globs, or lm-eval results_*.json files",
    )
    p.add_argument("--out", required=True, type=Path, help="directory for the report files")
    p.add_argument(
        "--at-tokens",
        default="auto",
        help="the val-loss table's token columns: auto (5B/20B/50B, or 10/40/100%% of small "
        "runs) or e.g. 5e9,20e9,50e9",
    )
    p.add_argument("--baseline", default="adamw", help="optimizer of the speedup (default adamw)")
    p.add_argument("--title", default="MARS reproduction report")
    p.add_argument("--published", type=Path, default=PUBLISHED, help=argparse.SUPPRESS)
    words = sys.argv[1:] if argv is None else argv
    # --budgets was renamed: a budget is the study's multiple of Chinchilla (docs/study.md)
    if any(w == "--budgets" or w.startswith("--budgets=") for w in words):
        raise SystemExit("report: --budgets is now --at-tokens (the same values: the val-loss "
                         "table's token columns)")  # fmt: skip
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Find and read the runs, build the report, write its files and print it."""
    args = parse_args(argv)
    try:  # fail on bad options before reading anything
        ana.parse_at_tokens(args.at_tokens)
        ana.Published.load(args.published)
    except ValueError as exc:
        raise SystemExit(f"report: {exc}") from None
    warnings: list[str] = []
    run_dirs, lm_files = expand(args.paths, warnings)
    per_run: dict[Path, list[Path]] = {}
    extra = []
    for f in lm_files:
        owner = owner_run(f, run_dirs)
        if owner is None:
            extra.append(f)
        else:
            per_run.setdefault(owner, []).append(f)
    runs = [r for d in run_dirs if (r := rr.load_run(d, per_run.get(d, []), warnings))]
    if not runs:
        raise SystemExit(
            f"report: no runs found in {' '.join(args.paths)}; a run directory "
            f"holds {runfiles.CONFIG} and {runfiles.METRICS}"
        )
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    for stale in [out / n for n in REPORT_FILES] + [
        p for g in FIGURE_PATTERNS for p in out.glob(g)
    ]:
        stale.unlink(missing_ok=True)
    report = build_report(
        runs,
        out=out,
        at_tokens=args.at_tokens,
        baseline=args.baseline,
        title=args.title,
        published_path=args.published,
        extra=extra,
        warnings=warnings,
    )
    text = abl.with_ablations(render(report), report["ablations"])
    (out / "report.md").write_text(text, encoding="utf-8")
    (out / "report.json").write_text(
        json.dumps(jsonable(report), indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    write_csvs(report, out)
    print(text)
    print(f"report written to {out}/", file=sys.stderr)
    return 0
