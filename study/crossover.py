"""Where MARS's variance reduction pays: the batch crossover, measured (docs/study.md, "The
batch crossover").

    python -m study.crossover run [--batches 8192 2048 32768 131072] [--jobs 2] [--device cuda]
                                  [--out runs/crossover] [--results results/crossover]
    python -m study.crossover publish [--batches ...]     # report what has run, into --results
    python -m study.crossover report                      # the crossover table and figure

proxy-100k for the same number of steps at every batch (the headline's 966: the budget grows
with the batch, 1x Chinchilla at 2,048 bytes, 4x at 8,192, 16x at 32,768, 64x at 131,072), three
arms: AdamW, MARS-AdamW, and MARS-AdamW with gamma = 0 (the correction switched off alone, every
other value equal), so ``Delta_gamma(B) = L(gamma) - L(gamma = 0)`` isolates the correction at
batch B. Each arm's lr is tuned on its own line at every batch (bracketed, selection seeds 0, 6,
7, chosen by their mean); every other knob is carried from the batch part's choices (both tuned
anew at 8,192 bytes: results/referee/batch, or results/referee/headline/batch before the move); the
gamma = 0 arm carries MARS-AdamW's. Evaluation seeds 1-5.

Each batch is one ``python -m study`` cell set in ``OUT/b<B>`` (its run directories, ignored by
git), the cheap batches first; its results (results.csv, the ledger of every finished run, and
curves.csv.gz, report.md, the figures) are published into ``RESULTS/b<B>`` after the batch and by
``publish`` while it runs. The same ``run`` command continues after a stop: every run
checkpoints every ``--ckpt-every`` steps and train.py resumes it from its newest checkpoint,
and a fresh clone with no run directories continues from the published ledgers (runs already in
a ledger are not run again).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from study.parts import copy_files

log = logging.getLogger("study")
ROOT = Path(__file__).resolve().parent.parent
MODEL = "proxy-100k"
STEPS_AT = {2048: 1.0}  # the budget at which the headline ran 966 steps: 1x at 2,048 bytes
BATCHES = [8192, 2048, 32768, 131072]  # the order they run in: the cheap cells first
ARMS = ["adamw", "mars-adamw", "mars-adamw:gamma=0"]
CARRIED_FROM = ("results/referee/batch/results.csv", "results/referee/batch/results.csv")
PUBLISHED = ("results.csv", "curves.csv.gz", "report.md", "curves.png", "study.png", "started.txt")
RESTORED = ("results.csv", "curves.csv.gz", "started.txt")  # what a continuing study reads


def budget_of(batch: int) -> float:
    """The budget (x Chinchilla) that gives the headline's steps at ``batch`` bytes a step:
    ``batch / 2048`` (966 steps at every batch for proxy-100k)."""
    if batch <= 0 or batch % 2048:
        raise ValueError(f"--batches {batch}: a positive multiple of 2048 bytes (a micro-batch "
                         "of 32 sequences of 64 bytes)")  # fmt: skip
    return STEPS_AT[2048] * batch / 2048


def carried_from() -> Path:
    for rel in CARRIED_FROM:
        if (ROOT / rel).is_file():
            return ROOT / rel
    raise SystemExit(f"study.crossover: the batch part's results are missing ({CARRIED_FROM[0]}):"
                     " the knobs other than the lr are carried from its choices")  # fmt: skip


def study_args(batch: int, out: Path, args: argparse.Namespace) -> list[str]:
    """The ``python -m study`` arguments of one batch's cells."""
    argv = [
        "--out", str(out), "--optimizers", *args.arms, "--models", MODEL,
        "--budgets", f"{budget_of(batch):g}", "--reference-budgets", "--batch-tokens", str(batch),
        "--knobs", "lr", "--center-from", str(carried_from()), "--center-cell", f"{MODEL}:1",
        "--no-swap", "--jobs", str(args.jobs), "--threads", str(args.threads),
    ]  # fmt: skip
    if args.device:
        argv += ["--device", args.device]
    if args.allow_dirty:
        argv.append("--allow-dirty")
    return [*argv, "--", f"ckpt_every={args.ckpt_every}"]


def run_batch(batch: int, args: argparse.Namespace, *, report_only: bool = False) -> int:
    """One batch's study: restore its ledger into its run tree, run (or report), publish."""
    from study.cli import main as study_main

    out, published = args.out / f"b{batch}", args.results / f"b{batch}"
    copy_files(published, out, RESTORED, overwrite=False)  # a fresh clone continues from these
    argv = study_args(batch, out, args)
    if report_only:  # a study flag: before the train.py overrides that follow "--"
        argv.insert(argv.index("--"), "--report-only")
    if report_only and not (out / "results.csv").is_file() and not (out / "runs").is_dir():
        return 0  # nothing has run at this batch yet
    rc = study_main(argv)
    copied = copy_files(out, published, PUBLISHED, overwrite=True)
    log.info("published %s into %s", ", ".join(copied) or "nothing", published)
    return rc


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m study.crossover", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("command", choices=["run", "publish", "report"])
    ap.add_argument("--batches", nargs="+", type=int, default=BATCHES, metavar="BYTES")
    ap.add_argument("--arms", nargs="+", default=ARMS, metavar="OPT")
    ap.add_argument("--out", type=Path, default=Path("runs/crossover"),
                    help="the run directories (not committed)")  # fmt: skip
    ap.add_argument("--results", type=Path, default=ROOT / "results" / "crossover",
                    help="the published ledgers, reports and figures (committed)")  # fmt: skip
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per run")
    ap.add_argument("--device", default=None, help="train.py's device (cuda: --jobs share it)")
    ap.add_argument("--ckpt-every", type=int, default=100,
                    help="steps between checkpoints of a run (a stop loses at most these)")  # fmt: skip
    ap.add_argument("--allow-dirty", action="store_true")
    args = ap.parse_args(argv)
    for name, value, low in (("--jobs", args.jobs, 1), ("--threads", args.threads, 1),
                             ("--ckpt-every", args.ckpt_every, 1)):  # fmt: skip
        if value < low:
            ap.error(f"{name} {value}: at least {low}")
    try:
        for b in args.batches:
            budget_of(b)
    except ValueError as exc:
        ap.error(str(exc))
    args.out = args.out if args.out.is_absolute() else Path.cwd() / args.out
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    args = parse(list(sys.argv[1:] if argv is None else argv))
    if args.command == "report":
        from study.crossover_report import write

        write(args.results, args.batches)
        return 0
    from study.crossover_report import write

    for batch in args.batches:
        rc = run_batch(batch, args, report_only=args.command == "publish")
        write(args.results, args.batches)  # the crossover's table, after each batch
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
