"""The study command (docs/study.md): tune, evaluate and report, resumable.

    python -m study [--out runs/study] [--optimizers adamw mars-adamw muon mars-m moonlight]
                    [--models proxy-100k] [--budgets 1] [--reference-budgets 2 4]
                    [--eval-seeds 1 2 3 4 5] [--select-seed 0] [--tune KEY ...]
                    [--center OPT:KEY=VALUE ...] [--untuned OPT ...]
                    [--merge OTHER/results.csv ... [--merge-only OPT ...]]
                    [--jobs 2] [--threads 1] [--nproc N] [--launcher local|submitit_local|slurm]
                    [--report-only] [--dry-run] [-- train.py overrides...]

Per (optimizer, model, budget): the lr (then each --tune key: coordinate descent) on a x2 grid
on the selection seed, extended until the best has two worse values on each side (a cap, flagged
loudly); then the evaluation seeds at the chosen values. The reference (AdamW) also runs, tuned
the same way, at each --reference-budgets multiple of every budget, so loss gaps become
data-equivalent speedups. Then OUT/results.csv (one row per run) and OUT/report.md with its
figure. The same command again continues an interrupted study.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

from study.cells import Study, mark_failed
from study.plan import Plan
from study.runner import LAUNCHERS, command, execute, group

log = logging.getLogger("study")
OPTIMIZERS = ["adamw", "mars-adamw", "muon", "mars-m", "moonlight"]


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(prog="python -m study", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--out", type=Path, default=Path("runs/study"))
    ap.add_argument("--optimizers", nargs="+", default=OPTIMIZERS)
    ap.add_argument("--models", nargs="+", default=["proxy-100k"])
    ap.add_argument("--budgets", nargs="+", type=float, default=[1.0],
                    help="tokens per block parameter / 20 (1 = Chinchilla)")  # fmt: skip
    ap.add_argument("--reference-budgets", nargs="*", type=float, default=[2.0, 4.0])
    ap.add_argument("--eval-seeds", nargs="+", type=int, default=[1, 2, 3, 4, 5])
    ap.add_argument("--select-seed", type=int, default=0)
    ap.add_argument("--tune", nargs="*", default=[], metavar="KEY",
                    help="more keys for coordinate descent after the lr (e.g. "
                    "optimizer.weight_decay); the Muon family's adamw_lr is always tuned")  # fmt: skip
    ap.add_argument("--center", action="append", default=[], metavar="OPT:KEY=VALUE",
                    help="where a tuned key's grid starts for an optimizer, e.g. "
                    "adamw:optimizer.lr=0.016 (repeatable; default: study/plan.py CENTERS)")  # fmt: skip
    ap.add_argument("--batch-tokens", type=int, default=2048)
    ap.add_argument("--jobs", type=int, default=1, help="commands at a time on this machine")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per command")
    ap.add_argument("--nproc", type=int, default=1, help="processes per run (torchrun, GPUs)")
    ap.add_argument("--launcher", choices=LAUNCHERS, default="local")
    ap.add_argument("--group-size", type=int, default=3, help="runs per train.py command")
    ap.add_argument("--report-only", action="store_true", help="results.csv and report only")
    ap.add_argument("--dry-run", action="store_true", help="print the first round's commands")
    ap.add_argument("--untuned", nargs="+", default=[], metavar="OPT",
                    help="optimizers (e.g. the ablation mars-soap:gamma=0) run at their --center "
                    "values on the evaluation seeds, without tuning")  # fmt: skip
    ap.add_argument("--merge", nargs="+", type=Path, default=[], metavar="CSV",
                    help="other studies' results.csv: their cells this study lacks join its "
                    "results and report (the same proxy, seeds and protocol)")  # fmt: skip
    ap.add_argument("--merge-only", nargs="+", default=None, metavar="OPT",
                    help="merge only these optimizers' cells (e.g. adamw: its other budgets "
                    "for the speedup curve)")  # fmt: skip
    ap.add_argument("--bootstrap", action="store_true", help="bootstrap intervals over pairs")
    return ap.parse_args(argv), extra


def parse_centers(items: list[str]) -> dict[str, dict[str, float]]:
    """``["adamw:optimizer.lr=0.016"]`` -> ``{"adamw": {"optimizer.lr": 0.016}}``."""
    centers: dict[str, dict[str, float]] = {}
    for item in items:
        opt, sep, rest = item.rpartition(":")  # a variant's name holds a colon
        key, eq, value = rest.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not (sep and eq and opt and key) or not math.isfinite(number) or number <= 0:
            raise ValueError(f"--center {item!r}: write OPT:KEY=VALUE with a positive number, "
                             "e.g. --center adamw:optimizer.lr=0.016")  # fmt: skip
        centers.setdefault(opt, {})[key] = number
    return centers


def plan_of(args: argparse.Namespace, extra: list[str]) -> Plan:
    out = args.out if args.out.is_absolute() else Path.cwd() / args.out
    return Plan(out=out, optimizers=args.optimizers, models=args.models, budgets=args.budgets,
                reference_budgets=args.reference_budgets, select_seed=args.select_seed,
                eval_seeds=args.eval_seeds, batch_tokens=args.batch_tokens, tune=args.tune,
                extra=extra, centers=parse_centers(args.center), untuned=args.untuned)  # fmt: skip


def next_groups(study: Study, args: argparse.Namespace, busy: set) -> list[list]:
    """The pending runs of the first cell (in the plan's order) that has some and none in
    flight, as commands' groups: cells finish one after another, so an interrupted study has
    whole comparisons, and a cell's next grid values wait for its runs in flight."""
    for cell in study.plan.cells():
        state = study.update(cell)
        for key, flag in state.flags.items():
            if flag == "capped" and (cell, key) not in study.warned:
                study.warned.add((cell, key))
                log.warning(
                    "!!! GRID CAP HIT: %s %s: the best is at the grid's edge", cell.name, key
                )
        if state.pending and cell not in busy:
            return group(state.pending, args.group_size)
    return []


def schedule(study: Study, args: argparse.Namespace) -> None:
    """Keep ``--jobs`` commands running until every cell is done (or a dry run's first batch)."""
    study.warned = set()
    queue: list = []
    running: dict = {}
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        while True:
            while len(running) < max(1, args.jobs):
                if not queue:
                    queue = next_groups(study, args, {c for c, _ in running.values()})
                    if not queue:
                        break
                runs = queue.pop(0)
                cmd = command(runs, launcher=args.launcher, nproc=args.nproc)
                cell = next(
                    c
                    for c in study.plan.cells()
                    if study.plan.cell_dir(c) in runs[0].out_dir.parents
                )
                fut = pool.submit(execute, [cmd], jobs=1, threads=args.threads,
                                  dry_run=args.dry_run, log_file=study.plan.out / "train.log")  # fmt: skip
                running[fut] = (cell, runs)
            if not running or args.dry_run:
                return
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                cell, runs = running.pop(fut)
                if fut.result()[0] != 0:
                    log.warning(
                        "a command of %s failed: its unfinished runs count as diverged", cell.name
                    )
                    mark_failed(runs)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    args, extra = parse(list(sys.argv[1:] if argv is None else argv))
    for path in args.merge:
        if not path.is_file():
            raise SystemExit(f"study: --merge {path}: no such file (a study's results.csv)")
    try:
        plan = plan_of(args, extra)
    except ValueError as exc:
        raise SystemExit(f"study: {exc}") from None
    plan.out.mkdir(parents=True, exist_ok=True)
    started = plan.out / "started.txt"  # the study's wall time counts from its first start
    if not started.is_file() and not args.report_only and not args.dry_run:
        started.write_text(f"{time.time():.0f}\n")
    study = Study(plan)
    t0 = time.perf_counter()
    if not args.report_only:
        schedule(study, args)
    if args.dry_run:
        return 0
    from study.report import write_report

    for cell in plan.cells():
        study.update(cell)
    write_report(study, bootstrap=args.bootstrap, merge=args.merge, merge_only=args.merge_only)
    log.info("study done in %.0f s of this session: %s", time.perf_counter() - t0, plan.out)
    return 0
