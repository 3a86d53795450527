"""Run every run of a published table, one after another, on the GPUs you have.

    scripts/paper_owt.sh --dry-run                      # print the commands, run nothing
    scripts/paper_owt.sh                                # all visible GPUs of this machine
    scripts/paper_mars_m.sh --only 'owt/small-*' -- wandb.mode=offline
    scripts/paper_fineweb.sh --nodes 2 --node-rank 0 --rdzv node0:29500  # each node, its rank
    scripts/paper_owt.sh --slurm --gpus 8 --slurm-partition gpu          # a Slurm job per run

Each run is `train.py experiment=<name> out_dir=<runs-dir>/<name> micro_batch_size=<B>`. The
experiment pins the official 100,000 steps of 480 x 1024 tokens; train.py derives gradient
accumulation from the micro-batch and the GPU count, so every GPU count trains the same global
batch. A finished run (summary.json steps >= max_steps: runtime/runfiles.py) is skipped; any
other is launched with the same command and train.py (resume=auto) continues it from its newest
checkpoint, so after an interruption just re-run the script. Runs: owt 10, fineweb 4, mars-m 20
(AdamW runs are shared with owt/fineweb: trained once).
With several nodes the runs directory must be on a filesystem every node sees. With --slurm the
command waits for the jobs; the jobs go on if it is stopped.

The runs of a table are the experiment files of its datasets' directories (configs/experiment/owt/,
configs/experiment/fineweb-edu/) for its optimizers; their model sizes, global batch and micro-batch
come from those files (runtime/config_files.py composes them). The micro-batch, unless
--micro-batch is given, is the largest divisor of the per-rank sequences whose memory
(trainer/memory_model.py: the model, the worst optimizer state of the size's runs, the loss path,
DDP's buckets, the CUDA context) fits the GPU; without a GPU or --gpu-mem, the official one or the
largest divisor below it. If a run still runs out of memory, pass --micro-batch with a smaller
divisor (the global batch and the update stay the same). Run it as `python -m scripts.launch` from the repository root.

The ablation sets (docs/ablations.md) are tables too: `--table ablation` (GPT-2 small on
OpenWebText) and `--table ablation-cpu` (a tiny GPT on the embedded corpus; one CPU process when
no GPU is visible). A `-- max_steps=N` override shortens a set; its equal-compute row
(exact-half) then takes N/2.
"""

from __future__ import annotations

import argparse
import fnmatch
import re
import shlex
import subprocess
import sys
from pathlib import Path

from runtime import commands, runfiles
from runtime.config_files import ROOT
from scripts.paper_runs import (  # noqa: F401 (BUCKET_VIEW, estimator: the tests' too)
    BUCKET_VIEW,
    CPU_TABLES,
    TABLES,
    LaunchError,
    TableRun,
    divisors,
    estimator,
    table_runs,
)
from trainer.checkpoint import latest_checkpoint
from trainer.memory_model import GIB, fitting_micro_batch

DRY_RUN_GPUS = 8  # the official GPU count, assumed by --dry-run when no GPU is visible
SLURM_MINUTES = 1440  # a common per-job limit; a run cut by it resumes when resubmitted


def gpu_memory_gib() -> float | None:
    """Total memory of GPU 0 in GiB, or None when no GPU is visible."""
    import torch

    if torch.cuda.device_count() == 0:
        return None
    return torch.cuda.get_device_properties(0).total_memory / GIB


def visible_gpus() -> int:
    import torch

    return torch.cuda.device_count()


def choose_micro_batch(runs: list[TableRun], per_rank: int, args) -> tuple[int, str]:
    """The micro-batch of one model size's runs, and why."""
    if args.micro_batch is not None:
        if per_rank % args.micro_batch:
            raise LaunchError(
                f"--micro-batch {args.micro_batch} does not divide the {per_rank} sequences per "
                f"rank; valid choices: {', '.join(map(str, divisors(per_rank)))}"
            )
        return args.micro_batch, "--micro-batch"
    mem = args.gpu_mem if args.gpu_mem is not None else gpu_memory_gib()
    if mem is None:
        official = runs[0].config["micro_batch_size"]
        b = max(d for d in divisors(per_rank) if d <= official)
        return b, "the official one or below: no GPU visible, no --gpu-mem"
    est = estimator(runs, args.gpus * args.nodes)
    b = fitting_micro_batch(divisors(per_rank), mem, est)
    warn = "" if b else "; over the GPU's memory even at 1, expect out-of-memory"
    b = b or 1
    return b, f"estimated {est(b).total / GIB:.1f} GiB of {mem:.1f} GiB{warn}"


def plan_micro_batches(runs: list[TableRun], args: argparse.Namespace) -> dict[str, int]:
    """The micro-batch of each model size in `runs` (printed with the reason)."""
    world = args.gpus * args.nodes
    by_size: dict[str, list[TableRun]] = {}
    for r in runs:
        by_size.setdefault(r.size, []).append(r)
    chosen, per_rank = {}, 0
    for size, group in by_size.items():
        cfg = group[0].config
        seqs = cfg["batch_tokens"] // (cfg.get("seq_len") or cfg["model"]["block_size"])
        if seqs % world:
            raise LaunchError(
                f"{seqs} sequences per step do not split evenly over {world} GPUs "
                f"({args.gpus} per node x {args.nodes} node(s)); the total GPU count must divide "
                f"{seqs}: {', '.join(map(str, divisors(seqs)))}"
            )
        per_rank = seqs // world
        chosen[size] = (*choose_micro_batch(group, per_rank, args), per_rank)
    print(f"{args.gpus} GPUs x {args.nodes} node(s): {per_rank} sequences per rank per step")
    for size, (b, why, per) in chosen.items():
        print(f"  {size}: micro-batch {b} of {per} per-rank sequences ({why}), "
              f"gradient accumulation {per // b}")  # fmt: skip
    return {size: b for size, (b, _, _) in chosen.items()}


def run_state(out_dir: Path, max_steps: int | None = None) -> tuple[bool, str]:
    """(finished, description) of the run in `out_dir`; `max_steps` overrides config.yaml's.
    The newest checkpoint is trainer.checkpoint's: step_N.pt files and DCP step_N/ directories."""
    if not out_dir.exists():
        return False, "new"
    summary = runfiles.finished(out_dir, max_steps)
    if runfiles.diverged(summary):  # over, not finished: running it again is refused
        return True, f"diverged at step {summary['steps']} (nonfinite.resume_diverged=true goes on)"
    if summary is not None:
        done = max_steps or (runfiles.read_config(out_dir) or {}).get("max_steps")
        return True, f"finished: {summary['steps']}/{done} steps"
    newest = latest_checkpoint(out_dir)
    if newest is None:
        return False, "started, no checkpoint: starts from step 0"
    step = re.match(r"step_(\d+)", newest.name).group(1)
    return False, f"interrupted: resumes from its checkpoint at step {step}"


def _override_value(extra: list[str], key: str) -> str | None:
    for e in extra:
        k, sep, v = e.lstrip("+~").partition("=")
        if sep and k == key:
            return v
    return None


def extra_max_steps(extra: list[str]) -> int | None:
    """A `max_steps=N` override (a longer run): what a finished run must have reached."""
    value = _override_value(extra, "max_steps")
    if value is not None and not value.isdigit():
        raise LaunchError(f"max_steps={value} is not a whole number of steps")
    return int(value) if value is not None else None


def run_steps(run: TableRun, extra: list[str]) -> int | None:
    """The max_steps override of ``run``: a `max_steps=N` in ``extra``, times the run's share
    (a row pinned to a share of the set's steps, the equal-compute exact-half, keeps it)."""
    n = extra_max_steps(extra)
    return None if n is None else max(1, round(n * run.steps_fraction))


def run_extra(run: TableRun, extra: list[str]) -> list[str]:
    """The overrides of ``run``: ``extra``, then its own share of a max_steps override."""
    n = run_steps(run, extra)
    return extra if run.steps_fraction == 1.0 or n is None else [*extra, f"max_steps={n}"]


def run_command(run: TableRun, out_dir: str, micro: int, args, extra) -> list[str]:
    """``run``'s train.py command under torchrun on this node (one of ``--nodes``)."""
    processes = commands.torchrun(args.gpus, nodes=args.nodes, node_rank=args.node_rank,
                                  rdzv=args.rdzv, rdzv_id=run.name.replace("/", "-"))  # fmt: skip
    train = [f"experiment={run.experiment}", f"out_dir={out_dir}", f"micro_batch_size={micro}"]
    return commands.train_command([*train, *run.overrides, *extra], processes=processes)


def slurm_commands(
    runs: list[TableRun], runs_dir: str, micro: dict, args, extra
) -> list[list[str]]:
    """One Hydra --multirun (submitit) command per group of runs that share their overrides."""
    groups: dict[tuple, list[str]] = {}
    for run in runs:
        tail = tuple(run_extra(run, extra)[len(extra) :])  # after extra: an equal-compute row's
        key = (micro[run.size], run.suffix, run.overrides, tail)
        groups.setdefault(key, []).append(run.experiment)
    launcher = commands.hydra_launcher(
        "submitit_slurm", nodes=args.nodes, tasks_per_node=args.gpus, gpus_per_node=args.gpus,
        timeout_min=args.slurm_time, partition=args.slurm_partition or None,
    )  # fmt: skip
    out = []
    for (micro_batch, suffix, overrides, tail), experiments in groups.items():
        train = ["experiment=" + ",".join(experiments), f"out_dir={runs_dir}/${{name}}{suffix}",
                 f"micro_batch_size={micro_batch}"]  # fmt: skip
        out.append(commands.train_command([*train, *launcher, *overrides, *extra, *tail],
                                          multirun=True))  # fmt: skip
    return out


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage block
        raise LaunchError(f"{message} (see --help)")


OPTIONS = [  # (flag, argparse keywords); the help says where the default comes from
    ("--table", dict(required=True, help=f"one of: {', '.join(TABLES)}")),
    ("--gpus", dict(type=int, help="GPUs per node (default: the visible ones; 8 in a dry run)")),
    ("--nodes", dict(type=int, default=1, help="nodes (default 1)")),
    ("--node-rank", dict(type=int, help="this node's rank, 0..nodes-1 (with --nodes > 1)")),
    ("--rdzv", dict(metavar="HOST:PORT", help="node 0's rendezvous address (--nodes > 1)")),
    ("--runs-dir", dict(help="where the runs go (default <repo>/runs/paper)")),
    ("--only", dict(action="append", metavar="GLOB", help="runs to run (fnmatch; repeatable)")),
    ("--dry-run", dict(action="store_true", help="print the commands, run nothing")),
    ("--slurm", dict(action="store_true", help="a Slurm job per run (Hydra submitit launcher)")),
    ("--slurm-partition", dict(metavar="P", help="Slurm partition (with --slurm)")),
    ("--slurm-time", dict(type=int, metavar="MINUTES", help=f"per job (default {SLURM_MINUTES})")),
]
MEM_HELP = "GiB per GPU for the memory model (default: GPU 0's memory)"


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Options, and the Hydra overrides after `--` (passed to every run)."""
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    ap = _Parser(
        prog="python -m scripts.launch",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage=f"%(prog)s --table {{{','.join(TABLES)}}} [options] [-- hydra overrides...]",
    )
    for flag, kwargs in OPTIONS:
        ap.add_argument(flag, **kwargs)
    mb = ap.add_mutually_exclusive_group()
    mb.add_argument(
        "--micro-batch",
        type=int,
        metavar="B",
        help="sequences per GPU per forward/backward; overrides the estimate",
    )
    mb.add_argument("--gpu-mem", type=float, metavar="GB", help=MEM_HELP)
    args = ap.parse_args(argv)
    check_args(args, extra)
    return args, extra


def check_args(args: argparse.Namespace, extra: list[str]) -> None:
    """Reject inconsistent options; fill in the GPU count and Slurm time."""
    if args.table not in TABLES:
        raise LaunchError(f"unknown table {args.table!r}; valid tables: {', '.join(TABLES)}")
    for opt in ("gpus", "nodes", "micro_batch", "gpu_mem", "slurm_time"):
        value = getattr(args, opt)
        if value is not None and value <= 0:
            raise LaunchError(f"--{opt.replace('_', '-')} must be positive, got {value}")
    last = args.nodes - 1
    problems = [
        (args.slurm and (args.rdzv or args.node_rank is not None),
         "--rdzv and --node-rank are for torchrun; with --slurm, Slurm places the ranks"),
        (not args.slurm and (args.slurm_partition or args.slurm_time),
         "--slurm-partition and --slurm-time need --slurm"),
        (not args.slurm and args.nodes > 1 and not args.rdzv,
         f"--nodes {args.nodes} needs --rdzv HOST:PORT (node 0's address and a free port)"),
        (not args.slurm and args.nodes > 1 and args.node_rank is None,
         f"--nodes {args.nodes} needs --node-rank R (0..{last}), this node's rank"),
        (args.node_rank is not None and not 0 <= args.node_rank <= last,
         f"--node-rank {args.node_rank} must be in 0..{last}"),
    ]  # fmt: skip
    for key, fix in (("experiment", "--table/--only"), ("out_dir", "--runs-dir"),
                     ("micro_batch_size", "--micro-batch")):  # fmt: skip
        problems.append((_override_value(extra, key) is not None,
                         f"the launcher sets {key}: use {fix}, not the override {key}=..."))  # fmt: skip
    for bad, message in problems:
        if bad:
            raise LaunchError(message)
    args.slurm_time = args.slurm_time or SLURM_MINUTES
    if args.gpus is None:
        args.gpus = visible_gpus()
        if args.gpus == 0 and args.table in CPU_TABLES:
            args.gpus = 1  # a CPU-scale table: one process on the CPU (gloo)
        if args.gpus == 0 and not args.dry_run:
            raise LaunchError("no GPU visible; pass --gpus N (GPUs per node), or use --dry-run")
        args.gpus = args.gpus or DRY_RUN_GPUS


def select_runs(runs: list[TableRun], patterns: list[str] | None) -> list[TableRun]:
    if not patterns:
        return runs
    chosen = [r for r in runs if any(fnmatch.fnmatchcase(r.name, p) for p in patterns)]
    if not chosen:
        names = ", ".join(r.name for r in runs)
        raise LaunchError(f"--only {' '.join(patterns)} matches no run; the runs: {names}")
    return chosen


def display_path(path: Path) -> str:
    """Relative to the repository (the commands' working directory) when inside it."""
    try:
        return path.relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args, extra = parse_args(argv)
        runs = select_runs(table_runs(args.table), args.only)
        extra_max_steps(extra)  # a bad max_steps fails here, before any run
        micro = plan_micro_batches(runs, args)
    except LaunchError as e:
        print(f"launch: error: {e}", file=sys.stderr)
        return 2
    runs_dir = Path.cwd() / args.runs_dir if args.runs_dir else ROOT / "runs" / "paper"
    shown_dir = display_path(runs_dir.resolve())
    print(f"# commands run from {ROOT}")
    todo = []
    for run in runs:
        run_over = run_extra(run, extra)
        done, state = run_state(runs_dir / run.name, run_steps(run, extra))
        cmd = run_command(run, f"{shown_dir}/{run.name}", micro[run.size], args, run_over)
        if done:
            shown = f": {shlex.join(cmd)}" if args.dry_run and not args.slurm else ""
            print(f"# skipped {run.name} ({state}){shown}")
        else:
            todo.append((run, state, cmd))
    if not todo:
        print("nothing to run: every selected run is finished")
    if args.slurm:
        for run, state, _ in todo:
            print(f"# {run.name}: {state}")
        runs_todo = [run for run, _, _ in todo]
        todo = [(None, "", c) for c in slurm_commands(runs_todo, shown_dir, micro, args, extra)]
    return execute(todo, args.dry_run)


def execute(commands: list, dry_run: bool) -> int:
    """Run (or print) the commands. Runs go one after another and the first failure stops with
    its exit code; the Slurm submissions start together (each waits for its own jobs)."""
    started = []
    for i, (run, state, cmd) in enumerate(commands):
        if run is not None:
            print(f"# {run.name}: {state}")
        print(("" if dry_run else "+ ") + shlex.join(cmd), flush=True)
        if dry_run:
            continue
        what = f"run {run.name}" if run else "a Slurm submission"
        started.append((what, subprocess.Popen(cmd, cwd=ROOT)))
        if run is None and i < len(commands) - 1:
            continue
        for what, proc in started:
            rc = wait(proc)
            if rc != 0:
                print(
                    f"launch: {what} failed (exit code {rc}); re-running this script skips "
                    "the finished runs and resumes the others from their newest checkpoints",
                    file=sys.stderr,
                )
                return rc
        started = []
    return 0


def wait(proc: subprocess.Popen) -> int:
    try:
        return proc.wait()
    except KeyboardInterrupt:  # the child got the same Ctrl-C: let it stop its workers
        proc.wait()
        return 130


if __name__ == "__main__":
    sys.exit(main())
