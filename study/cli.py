"""The study command (docs/study.md): tune, evaluate and report, resumable.

    python -m study [--out runs/study] [--optimizers adamw mars-adamw muon mars-m moonlight]
                    [--models proxy-100k] [--budgets 1] [--baseline-budgets 2 4]
                    [--select-seeds 0 6 7] [--eval-seeds 1 2 3 4 5]
                    [--knobs lr aux_lr wd beta2 warmup] [--center OPT:KNOB=VALUE ...]
                    [--untuned OPT ...] [--merge OTHER/results.csv ... [--merge-only OPT ...]]
                    [--jobs 2] [--threads 1] [--nproc N] [--device cpu|cuda]
                    [--launcher local|submitit_local|slurm] [--allow-dirty]
                    [--report-only] [--dry-run] [-- train.py overrides...]
    python -m study run|publish|compare <study> ...    # a study defined as data: study/parts.py

Per (optimizer, model, budget): every knob tuned the same way for every optimizer (study/knobs.py)
by coordinate descent until a whole pass moves none, each line a successive halving (a lattice
bracketed on the first selection seed, its best few on every selection seed, the choice the
lowest mean over them, bracketed by worse means); then the evaluation seeds at the chosen values
(and the final lr line's finalists, to measure selection error). The baseline (AdamW) also runs
at each --baseline-budgets multiple of every budget (its lrs tuned, the other knobs carried), so
loss gaps become data-equivalent speedups. Then OUT/results.csv (one row per run), curves.csv.gz
(every run's curves) and OUT/report.md with its figures. The same command again continues an
interrupted study; it refuses a working tree with uncommitted changes (--allow-dirty).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

from study import definition
from study.knobs import KNOBS
from study.plan import Plan
from study.runner import (
    LAUNCHERS,
    ROOT,
    check_overrides,
    stop_all,
)
from study.scheduler import schedule
from study.state import Study

log = logging.getLogger("study")
# Every default of the command is its Plan field's (study/plan.py): stated once, there.
DEFAULTS = {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING
            else f.default for f in dataclasses.fields(Plan) if f.init}  # fmt: skip


# Flags renamed so that each word has one meaning (``reference``: MARS's reference gradient;
# the study's AdamW is its baseline): the old spelling is refused with the new one.
RENAMED = {"--reference-budgets": "--baseline-budgets"}


def refuse_renamed(argv: list[str], renamed: dict[str, str] = RENAMED) -> None:
    """One line naming the new spelling of a renamed flag (``--old`` or ``--old=...``)."""
    for arg in argv:
        new = renamed.get(arg.split("=", 1)[0])
        if new:
            raise SystemExit(f"study: {arg.split('=', 1)[0]} is now {new} (the same values)")


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    refuse_renamed(argv)
    D = {k: list(v) if isinstance(v, list) else v for k, v in DEFAULTS.items()}  # fresh lists
    ap = argparse.ArgumentParser(prog="python -m study", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--out", type=Path, default=D["out"])
    ap.add_argument("--optimizers", nargs="+", default=D["optimizers"])
    ap.add_argument("--models", nargs="+", default=D["models"])
    ap.add_argument("--budgets", nargs="+", type=float, default=D["budgets"],
                    help="tokens per block parameter / 20 (1 = Chinchilla)")  # fmt: skip
    ap.add_argument("--baseline-budgets", nargs="*", type=float, default=D["baseline_budgets"],
                    help="multiples of each budget at which the baseline (AdamW) also runs, its "
                    "lrs tuned: its loss curve turns gaps into speedups (none: no speedups)")  # fmt: skip
    ap.add_argument("--eval-seeds", nargs="+", type=int, default=D["eval_seeds"])
    ap.add_argument("--select-seeds", nargs="+", type=int, default=D["select_seeds"],
                    help="seeds that choose (by the mean over them); disjoint from --eval-seeds")  # fmt: skip
    ap.add_argument("--knobs", nargs="+", default=D["knobs"], choices=list(KNOBS),
                    help="the knobs tuned for every optimizer (study/knobs.py)")  # fmt: skip
    ap.add_argument("--center", action="append", default=[], metavar="OPT:KNOB=VALUE",
                    help="where a tuned knob's search starts for an optimizer, or an untuned "
                    "knob's fixed value, e.g. adamw:lr=0.016 (repeatable)")  # fmt: skip
    ap.add_argument("--center-from", type=Path, default=D["center_from"], metavar="CSV",
                    help="start (or fix) every optimizer's knobs at the values another study "
                    "chose (its results.csv); --center wins")  # fmt: skip
    ap.add_argument("--center-cell", default=D["center_cell"], metavar="MODEL:BUDGET",
                    help="the cell of --center-from to read (default: the file's only one)")  # fmt: skip
    ap.add_argument(
        "--finalists", type=int, default=D["finalists"], help="values per line on every seed"
    )
    ap.add_argument(
        "--max-passes", type=int, default=D["max_passes"], help="coordinate-descent passes"
    )
    ap.add_argument("--no-swap", action="store_true",
                    help="skip the lr finalists on the evaluation seeds (selection error)")  # fmt: skip
    ap.add_argument("--evals", type=int, default=D["evals"], help="validation evaluations per run")
    ap.add_argument("--collapse-floor", type=float, default=D["collapse_floor"],
                    help="a final loss at or above it is a collapse (default: the validation "
                    "split's bigram loss)")  # fmt: skip
    ap.add_argument("--allow-dirty", action="store_true",
                    help="run from a working tree with uncommitted changes (rows are marked)")  # fmt: skip
    ap.add_argument("--device", default=D["device"],
                    help="train.py's device for every run (cuda: --jobs runs share the GPU)")  # fmt: skip
    ap.add_argument("--batch-tokens", type=int, default=D["batch_tokens"])
    ap.add_argument(
        "--jobs", type=int, default=D["jobs"], help="commands at a time on this machine"
    )
    ap.add_argument("--threads", type=int, default=D["threads"], help="CPU threads per command")
    ap.add_argument(
        "--nproc", type=int, default=D["nproc"], help="processes per run (torchrun, GPUs)"
    )
    ap.add_argument("--launcher", choices=LAUNCHERS, default=D["launcher"])
    ap.add_argument("--report-only", action="store_true", help="results.csv and report only")
    ap.add_argument("--dry-run", action="store_true", help="print the first round's commands")
    ap.add_argument("--untuned", nargs="+", default=D["untuned"], metavar="OPT",
                    help="optimizers (e.g. the ablation mars-soap:gamma=0) run at their --center "
                    "values on the evaluation seeds, without tuning")  # fmt: skip
    ap.add_argument("--merge", nargs="+", type=Path, default=D["merge"], metavar="CSV",
                    help="other studies' results.csv: their cells this study lacks join its "
                    "results and report (the same proxy, seeds and protocol)")  # fmt: skip
    ap.add_argument("--merge-only", nargs="+", default=D["merge_only"], metavar="OPT",
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


# The flags that say what a part says (study/definition.py PART_KEYS, the same names), and those
# that set the Plan's other fields (how it runs and reports; center_from and merge are files here)
PART_FLAGS = ("optimizers", "untuned", "models", "budgets", "baseline_budgets", "select_seeds",
              "eval_seeds", "batch_tokens", "knobs")  # fmt: skip
OPTION_FLAGS = ("center_from", "center_cell", "merge", "merge_only", "finalists", "max_passes",
                "evals", "collapse_floor", "bootstrap", "jobs", "threads", "nproc", "device",
                "launcher", "report_only", "dry_run", "allow_dirty")  # fmt: skip


def plan_of(args: argparse.Namespace, extra: list[str]) -> Plan:
    """The flag command's Plan: a one-part definition (its run tree ``--out``) through
    study/definition.py's ``plan_of``, as every part of a study. Raises ValueError."""
    values = {k: getattr(args, k) for k in PART_FLAGS}
    values |= {"centers": parse_centers(args.center), "swap": not args.no_swap, "overrides": extra}
    part = definition.Part("", args.out.name, values, runs=args.out, results=args.out)
    return definition.plan_of(part, {}, {k: getattr(args, k) for k in OPTION_FLAGS})


def _number(value: float) -> str:
    """A budget as the command line writes it: ``4.0`` -> ``4``, ``0.25`` -> ``0.25``."""
    return str(int(value)) if float(value).is_integer() else repr(value)


def command_line(plan: Plan, shown: tuple[str, ...] | set[str] = ()) -> list[str]:
    """The flags of ``python -m study`` that build ``plan`` (its fields that differ from the
    defaults, and those named in ``shown``), in the order the help lists them; ``--out``
    from the working folder where it is inside it."""
    out = plan.out.relative_to(Path.cwd()) if plan.out.is_relative_to(Path.cwd()) else plan.out
    argv = ["--out", str(out)]

    def said(name: str) -> bool:
        return name in shown or getattr(plan, name) != DEFAULTS[name]

    for name in ("optimizers", "untuned", "models", "budgets", "baseline_budgets",
                 "select_seeds", "eval_seeds", "batch_tokens", "knobs"):  # fmt: skip
        value = getattr(plan, name)
        if said(name) and (value or name == "baseline_budgets"):
            items = value if isinstance(value, list) else [value]
            number = name.endswith("budgets")
            argv += [f"--{name.replace('_', '-')}", *(_number(x) if number else str(x)
                                                     for x in items)]  # fmt: skip
    for opt, knobs in plan.centers.items():
        argv += [a for k, x in knobs.items() for a in ("--center", f"{opt}:{k}={x!r}")]
    for name in ("center_from", "center_cell", "merge", "merge_only"):
        value = getattr(plan, name)
        if value is not None and value != []:
            argv += [f"--{name.replace('_', '-')}", *map(str, value if isinstance(value, list)
                                                          else [value])]  # fmt: skip
    argv += [] if plan.swap else ["--no-swap"]
    for name in ("finalists", "max_passes", "evals", "collapse_floor", "nproc", "launcher"):
        if said(name):
            argv += [f"--{name.replace('_', '-')}", str(getattr(plan, name))]
    argv += ["--bootstrap"] if plan.bootstrap else []
    return argv + run_flags(plan)


def run_flags(plan: Plan) -> list[str]:
    """The flags of how ``plan`` runs (``--report-only``, or ``--jobs`` and the rest), then
    ``--`` and its train.py overrides."""
    argv = []
    if plan.report_only:
        argv.append("--report-only")
    else:
        argv += ["--jobs", str(plan.jobs), "--threads", str(plan.threads)]
        argv += ["--device", plan.device] if plan.device else []
        argv += ["--dry-run"] if plan.dry_run else []
        argv += ["--allow-dirty"] if plan.allow_dirty else []
    return argv + (["--", *plan.extra] if plan.extra else [])


RESULTS = "results/"  # the published ledgers, reports and figures: outputs, not code


def dirty_files(root: Path = ROOT) -> list[str]:
    """Tracked files with uncommitted changes under ``root`` (empty outside a git checkout),
    the study's own published files (results/) aside: a study publishes each part there, and
    the next part must not refuse to run for it (trainer.rundir.git_info leaves them out too)."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return []
    return [line[3:] for line in out.splitlines()
            if line.strip() and not line[3:].startswith(RESULTS)]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """The flag command: its Plan (``plan_of``), run."""
    args, extra = parse(list(sys.argv[1:] if argv is None else argv))
    try:
        plan = plan_of(args, extra)
    except ValueError as exc:
        raise SystemExit(f"study: {exc}") from None
    return run(plan, argv)


def run(plan: Plan, argv: list[str] | None = None) -> int:
    """Run ``plan`` (a study part's or the flag command's): every cell, then its results.csv
    and report; ``argv``: the command a stop names to continue (None: this process's)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if not (plan.report_only or plan.dry_run or plan.allow_dirty):
        dirty = dirty_files()
        if dirty:
            raise SystemExit(
                "study: the working tree has uncommitted changes to tracked files ("
                + ", ".join(dirty[:5])
                + (", ..." if len(dirty) > 5 else "")
                + "): its rows could not name the code they ran. Commit them, or pass "
                "--allow-dirty (those rows are marked +dirty in results.csv)"
            )
    study = Study(plan)
    if not plan.report_only:
        try:
            preflight(study, dry_run=plan.dry_run)
        except ValueError as exc:
            raise SystemExit(f"study: {exc}") from None
    if not plan.dry_run:  # a dry run writes nothing
        plan.out.mkdir(parents=True, exist_ok=True)
    started = plan.out / "started.txt"  # the study's wall time counts from its first start
    if not started.is_file() and not plan.report_only and not plan.dry_run:
        started.write_text(f"{time.time():.0f}\n")
    t0 = time.perf_counter()
    if not plan.report_only:
        # a scheduler's stop: as Ctrl-C, one line; the caller's handler back afterwards (main may
        # run inside another program, a test runner, whose later forks would inherit this one)
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            schedule(study, plan)
        except KeyboardInterrupt:
            raise SystemExit(stopped_line(study, argv)) from None
        finally:
            if previous is not None:  # None: set outside Python, which cannot be put back
                signal.signal(signal.SIGTERM, previous)
    if plan.dry_run:
        return 0
    from study.report import write_report

    for cell in plan.cells():
        study.update(cell)
    write_report(study, bootstrap=plan.bootstrap, merge=plan.merge,
                 merge_only=plan.merge_only, collapse_floor=plan.collapse_floor)  # fmt: skip
    unfinished = [c.name for c, s in study.states.items() if not s.done]
    if unfinished:
        log.info("study report written, PARTIAL: %d cells unfinished (%s); the same command "
                 "without --report-only continues them: %s", len(unfinished),
                 ", ".join(unfinished[:3]) + (", ..." if len(unfinished) > 3 else ""),
                 plan.out)  # fmt: skip
    else:
        log.info("study done in %.0f s of this session: %s", time.perf_counter() - t0, plan.out)
    return 0


def preflight(study: Study, *, dry_run: bool) -> None:
    """Every optimizer's first run checked as train.py would check it (study.runner's
    ``check_overrides``: the keys, values, device and dtype of the part's and the command line's
    overrides), before anything is scheduled: a bad ``--set`` or ``--device`` is one line here,
    not a command that fails at once, again and again."""
    plan, seen = study.plan, set()
    seed = (plan.select_seeds or plan.eval_seeds or [0])[0]
    for cell in plan.cells():
        if cell.optimizer in seen or not plan.is_main(cell):
            continue
        seen.add(cell.optimizer)
        values = study.start(cell) or {}
        overrides = list(study.overrides(cell, values, seed))
        try:
            check_overrides(overrides, dry_run=dry_run)
        except ValueError as exc:
            raise ValueError(f"{cell.optimizer}'s runs would be refused by train.py: {exc}; "
                             "nothing was run (fix the override: --set or the part's own)") from None  # fmt: skip


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def stopped_line(study: Study, argv: list[str] | None) -> str:
    """The one line a stopped study ends with: what finished, and the command that continues."""
    import shlex

    asked = stop_all() or getattr(study, "asked_to_stop", 0)  # schedule's stop asked them first
    done = sum(1 for c in study.plan.cells() if c in study.states and study.states[c].done)
    cmd = shlex.join(["python", "-m", "study", *(sys.argv[1:] if argv is None else argv)])
    return (
        f"study: stopped; {done} of {len(study.plan.cells())} cells complete, {asked} "
        f"run(s) in flight asked to checkpoint and stop; the same command continues: {cmd}"
    )
