"""The CPU scaling study (docs/scaling-study.md): three widths, five optimizers, on a CPU.

    python -m scripts.scaling_cpu [--out runs/scaling-cpu] [--dry-run] [-- overrides...]

For every width (64, 128, 192: configs/model/tiny-<w>.yaml) and optimizer (AdamW, Muon,
MARS-AdamW, MARS-M, Moonlight) through the experiment files configs/experiment/scaling-cpu/:

1. sweep: train.py --multirun over three learning rates (x0.5, x1, x2 of the optimizer's GPT-2
   small lr), into OUT/sweep/w<w>-<opt>/optimizer.lr=<lr>/ (seed 1337);
2. seeds: the sweep's best lr (lowest best_val_loss in summary.json) with seeds 1338 and 1339,
   into OUT/seeds/w<w>-<opt>/seed=<s>/;
3. report: python -m report over the sweep (OUT/sweep-report) and over the chosen runs, three
   seeds per (width, optimizer) (OUT/report: speedups with intervals per width, the loss fits
   against compute and their figure).

75 runs of 100 steps of 1,024 tokens. Started again, train.py skips finished runs and continues
interrupted ones (docs/failures.md), so after an interruption run the same command. Extra Hydra
overrides after ``--`` go to every run.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

from runtime import commands, runfiles

ROOT = Path(__file__).resolve().parent.parent
WIDTHS = (64, 128, 192)
OPTIMIZERS = ("adamw", "muon", "mars-adamw", "mars-m", "moonlight")
LRS = {  # x0.5, x1, x2 of configs/optimizer/<opt>.yaml's lr (GPT-2 small's)
    "adamw": ("3e-4", "6e-4", "1.2e-3"),
    "muon": ("1e-2", "2e-2", "4e-2"),
    "mars-adamw": ("3e-3", "6e-3", "1.2e-2"),
    "mars-m": ("3e-3", "6e-3", "1.2e-2"),
    "moonlight": ("3e-3", "6e-3", "1.2e-2"),
}
SEEDS = (1338, 1339)  # the sweep's run is seed 1337 (the config's)
RUN_OPTIONS = ("progress=false",)


def experiment(width: int, opt: str) -> str:
    return f"scaling-cpu/w{width}-{opt}"


def train_cmd(width: int, opt: str, sweep_dir: Path, values: list[str], extra: list[str]):
    """One train.py --multirun command of the study."""
    overrides = [f"experiment={experiment(width, opt)}", *values, *RUN_OPTIONS,
                 f"hydra.sweep.dir={sweep_dir}", *extra]  # fmt: skip
    return commands.train_command(overrides, processes=[sys.executable], multirun=True)


def best_run(sweep_dir: Path) -> tuple[Path, float]:
    """The sweep job with the lowest best validation loss, and its lr (from its config.yaml).
    A SystemExit naming the directory when no job has finished."""
    done = []
    for job in sorted(sweep_dir.glob("*")):
        best = (runfiles.read_summary(job) or {}).get("best_val_loss")
        if isinstance(best, int | float):
            lr = runfiles.read_config(job)["optimizer"]["lr"]
            done.append((float(best), job, float(lr)))
    if not done:
        raise SystemExit(
            f"scaling_cpu: no finished sweep run in {sweep_dir}; run the sweep stage first "
            "(the same command without --dry-run)"
        )
    _, job, lr = min(done)
    return job, lr


def edge_note(opt: str, lr: float) -> str:
    """A warning when ``lr`` is the smallest or largest of the sweep: its optimum may lie
    beyond, so the comparison is at a bound of the grid, not at a tuned lr."""
    grid = sorted(float(x) for x in LRS[opt])
    if lr in (grid[0], grid[-1]):
        side = "largest" if lr == grid[-1] else "smallest"
        return f"; WARNING: the {side} lr swept, the best may lie beyond it"
    return ""


def execute(cmd: list[str], dry_run: bool) -> None:
    """Print the command; run it unless ``dry_run`` (a failure stops the study)."""
    print(("" if dry_run else "+ ") + shlex.join(cmd), flush=True)
    if not dry_run and (rc := subprocess.call(cmd, cwd=ROOT)) != 0:
        raise SystemExit(
            f"scaling_cpu: exit code {rc}; the same command again skips the finished runs and "
            "continues the others"
        )


def seed_stage(out: Path, extra: list[str], dry_run: bool, train: bool = True) -> list[Path]:
    """Per (width, optimizer) the sweep's best lr with SEEDS; the chosen runs' directories
    (``train=False``: only those, nothing run)."""
    chosen = []
    seeds = "seed=" + ",".join(map(str, SEEDS))
    for width in WIDTHS:
        for opt in OPTIMIZERS:
            name = f"w{width}-{opt}"
            if dry_run and not (out / "sweep" / name).is_dir():
                lr_text, job = (
                    "<best lr of the sweep>",
                    out / "sweep" / name / "optimizer.lr=<best>",
                )
            else:
                job, lr = best_run(out / "sweep" / name)
                lr_text = repr(lr)
                print(f"# best lr for {name}: {lr_text} ({job.name}){edge_note(opt, lr)}")
            values = [f"optimizer.lr={lr_text}", seeds]
            if train:
                execute(train_cmd(width, opt, out / "seeds" / name, values, extra), dry_run)
            chosen += [job, out / "seeds" / name]
    return chosen


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(
        prog="python -m scripts.scaling_cpu",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", type=Path, default=Path("runs/scaling-cpu"), help="study directory")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--reports-only", action="store_true",
                    help="only the two reports, of the runs there are (no training)")  # fmt: skip
    args = ap.parse_args(argv)
    out = args.out if args.out.is_absolute() else Path.cwd() / args.out
    for width in WIDTHS if not args.reports_only else ():
        for opt in OPTIMIZERS:
            values = ["optimizer.lr=" + ",".join(LRS[opt])]
            execute(
                train_cmd(width, opt, out / "sweep" / f"w{width}-{opt}", values, extra),
                args.dry_run,
            )
    chosen = seed_stage(out, extra, args.dry_run, train=not args.reports_only)
    report = [sys.executable, "-m", "report"]
    execute(
        [
            *report,
            str(out / "sweep"),
            "--out",
            str(out / "sweep-report"),
            "--title",
            "CPU scaling study: the sweep",
        ],
        args.dry_run,
    )
    execute(
        [
            *report,
            *map(str, chosen),
            "--out",
            str(out / "report"),
            "--title",
            "CPU scaling study (3 widths, 3 seeds)",
        ],
        args.dry_run,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
