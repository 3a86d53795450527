"""Run every run of a published table, one after another, on the GPUs you have.

    scripts/paper_owt.sh --dry-run                      # print the commands, run nothing
    scripts/paper_owt.sh                                # all visible GPUs of this machine
    scripts/paper_mars_m.sh --only 'owt/small-*' -- wandb.mode=offline
    scripts/paper_fineweb.sh --nodes 2 --node-rank 0 --rdzv node0:29500  # each node, its rank
    scripts/paper_owt.sh --slurm --gpus 8 --slurm-partition gpu          # a Slurm job per run

Each run is `train.py experiment=<name> out_dir=<runs-dir>/<name> micro_batch_size=<B>`. The
experiment pins the official 100,000 steps of 480 x 1024 tokens; train.py derives gradient
accumulation from the micro-batch and the GPU count, so every GPU count trains the same global
batch. A finished run (summary.json steps >= max_steps) is skipped; any other is launched with the
same command and train.py (resume=auto) continues it from its newest checkpoint, so after an
interruption just re-run the script. Runs: owt 10, fineweb 4, mars-m 20 (AdamW runs are shared
with owt/fineweb: trained once).
With several nodes the runs directory must be on a filesystem every node sees. With --slurm the
command waits for the jobs; the jobs go on if it is stopped.

The micro-batch, unless --micro-batch is given, is the largest divisor of the per-rank sequences
that estimate_memory_gib says fits the GPU. THE ESTIMATE IS UNTESTED ON GPUS: if a run runs out of
memory, pass --micro-batch with a smaller divisor (the global batch and the update stay the same).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
TABLES = ("owt", "fineweb", "mars-m")
GLOBAL_SEQS = 480  # sequences per optimizer step (491,520 tokens), official
SEQ_LEN, VOCAB = 1024, 50304
GIB = 2**30
HEADROOM = 0.85  # fraction of the GPU memory the estimate may fill
DRY_RUN_GPUS = 8  # the official GPU count, assumed by --dry-run when no GPU is visible
SLURM_MINUTES = 1440  # a common per-job limit; a run cut by it resumes when resubmitted


class LaunchError(Exception):
    """Bad input: reported as one line and a non-zero exit."""


@dataclass(frozen=True)
class ModelSize:
    params: float
    n_layer: int
    n_embd: int
    official_micro_batch: int  # per GPU, on the official 8 GPUs


SIZES = {
    "small": ModelSize(124.4e6, 12, 768, 15),
    "medium": ModelSize(354.6e6, 24, 1024, 15),
    "large": ModelSize(773.6e6, 36, 1280, 5),
    "xl": ModelSize(1556.8e6, 48, 1600, 5),
}


@dataclass(frozen=True)
class Run:
    experiment: str  # configs/experiment/<experiment>.yaml
    suffix: str = ""  # a variant of the experiment: appended to its name and out_dir
    overrides: tuple[str, ...] = ()  # the variant's overrides

    @property
    def name(self) -> str:
        return self.experiment + self.suffix

    @property
    def size(self) -> str:
        return self.experiment.split("/")[1].split("-")[0]


def _grid(dataset: str, sizes: str, optimizers: str) -> list[str]:
    return [f"{dataset}/{s}-{o}" for s in sizes.split() for o in optimizers.split()]


def table_runs(table: str) -> list[Run]:
    """The runs of a table, in launch order."""
    if table == "owt":
        names = _grid("owt", "small medium large", "adamw muon mars-adamw")
        return [Run(n) for n in [*names, "owt/small-mars-adamw-exact"]]
    if table == "fineweb":
        return [Run(n) for n in _grid("fineweb-edu", "small xl", "adamw mars-adamw")]
    if table == "mars-m":
        names = _grid("owt", "small medium large", "adamw moonlight mars-m")
        names += _grid("fineweb-edu", "small xl", "adamw moonlight mars-m")
        runs = []
        for n in names:
            runs.append(Run(n))
            if n.endswith("-mars-m"):  # the MARS-M plots show gamma 0.025 (config) and 0.01
                runs.append(Run(n, "-gamma0.01", ("optimizer.gamma=0.01",)))
        return runs
    raise LaunchError(f"unknown table {table!r}; valid tables: {', '.join(TABLES)}")


def estimate_memory_gib(size: ModelSize, micro_batch: int) -> float:
    """Rough peak GPU memory (GiB) of one rank training `size` on `micro_batch` sequences.

    UNTESTED ON GPUS; --micro-batch overrides it. fixed = params x (4 B fp32 weights + 4 B grads
    + 16 B optimizer state, the worst case: MARS exact's two moments and two gradient copies)
    + 2 GiB (CUDA context, allocator slack, buffers). Per sequence: bf16 activations with flash
    attention, about 34 x n_embd x seq x n_layer bytes, plus the logits, vocab x seq x 10 bytes
    (bf16 logits, an fp32 copy for the loss and its gradient).
    """
    fixed = size.params * (4 + 4 + 16) + 2 * GIB
    per_seq = 34 * size.n_embd * SEQ_LEN * size.n_layer + VOCAB * SEQ_LEN * 10
    return (fixed + micro_batch * per_seq) / GIB


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def fitting_micro_batch(size: ModelSize, per_rank: int, mem_gib: float) -> int:
    """The largest divisor of `per_rank` whose estimate fits HEADROOM of the memory (else 1)."""
    fits = [b for b in divisors(per_rank) if estimate_memory_gib(size, b) <= HEADROOM * mem_gib]
    return max(fits, default=1)


def visible_gpus() -> int:
    import torch  # imported only when needed: it is slow to import

    return torch.cuda.device_count()


def gpu_memory_gib() -> float | None:
    """Total memory of GPU 0 in GiB, or None when no GPU is visible."""
    import torch

    if torch.cuda.device_count() == 0:
        return None
    return torch.cuda.get_device_properties(0).total_memory / GIB


def choose_micro_batch(size: ModelSize, per_rank: int, args: argparse.Namespace) -> tuple[int, str]:
    """The micro-batch of one model size, and why."""
    if args.micro_batch is not None:
        if per_rank % args.micro_batch:
            raise LaunchError(
                f"--micro-batch {args.micro_batch} does not divide the {per_rank} sequences per "
                f"rank; valid choices: {', '.join(map(str, divisors(per_rank)))}"
            )
        return args.micro_batch, "--micro-batch"
    mem = args.gpu_mem if args.gpu_mem is not None else gpu_memory_gib()
    if mem is None:
        b = max(d for d in divisors(per_rank) if d <= size.official_micro_batch)
        return b, "the official one or below: no GPU visible, no --gpu-mem"
    b = fitting_micro_batch(size, per_rank, mem)
    est = estimate_memory_gib(size, b)
    warn = "; over the budget even at 1, expect out-of-memory" if est > HEADROOM * mem else ""
    return b, f"estimated {est:.0f} GiB of {mem:.0f} GiB{warn}"


def plan_micro_batches(runs: list[Run], args: argparse.Namespace) -> dict[str, int]:
    """The micro-batch of each model size in `runs` (printed with the reason)."""
    world = args.gpus * args.nodes
    if GLOBAL_SEQS % world:
        raise LaunchError(
            f"{GLOBAL_SEQS} sequences per step do not split evenly over {world} GPUs "
            f"({args.gpus} per node x {args.nodes} node(s)); the total GPU count must divide "
            f"{GLOBAL_SEQS}: {', '.join(map(str, divisors(GLOBAL_SEQS)))}"
        )
    per_rank = GLOBAL_SEQS // world
    sizes = dict.fromkeys(r.size for r in runs)
    chosen = {size: choose_micro_batch(SIZES[size], per_rank, args) for size in sizes}
    print(f"{args.gpus} GPUs x {args.nodes} node(s): {per_rank} sequences per rank per step")
    for size, (b, why) in chosen.items():
        print(f"  {size}: micro-batch {b} of {per_rank} per-rank sequences ({why}), "
              f"gradient accumulation {per_rank // b}")  # fmt: skip
    return {size: b for size, (b, _) in chosen.items()}


def _read_int(path: Path, key: str) -> int | None:
    """`key` of a JSON or YAML mapping file; None when absent or unreadable (not known)."""
    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        return int(data[key])
    except (OSError, ValueError, TypeError, KeyError, yaml.YAMLError):
        return None


def run_state(out_dir: Path, max_steps: int | None = None) -> tuple[bool, str]:
    """(finished, description) of the run in `out_dir`; `max_steps` overrides config.yaml's."""
    if not out_dir.exists():
        return False, "new"
    steps = _read_int(out_dir / "summary.json", "steps")
    if max_steps is None:
        max_steps = _read_int(out_dir / "config.yaml", "max_steps")
    if steps is not None and max_steps is not None and steps >= max_steps:
        return True, f"finished: {steps}/{max_steps} steps"
    ckpts = [p.stem.removeprefix("step_") for p in out_dir.glob("checkpoints/step_*.pt")]
    newest = max((int(s) for s in ckpts if s.isdigit()), default=None)
    if newest is None:
        return False, "started, no checkpoint: starts from step 0"
    return False, f"interrupted: resumes from its checkpoint at step {newest}"


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


def _exe(name: str) -> str | None:
    """This Python's `name` script: plain `name` when PATH finds that one, else its path."""
    sibling = Path(sys.executable).parent / name
    if not sibling.exists():
        return None
    on_path = shutil.which(name)  # same directory, not same target: a venv's python is a link
    same = on_path and Path(on_path).parent.resolve() == sibling.parent.resolve()
    return name if same else str(sibling)


def python_cmd() -> list[str]:
    return [_exe("python") or sys.executable]


def torchrun_cmd() -> list[str]:
    exe = _exe("torchrun")
    return [exe] if exe else [*python_cmd(), "-m", "torch.distributed.run"]


def torchrun_command(run: Run, out_dir: str, micro: int, args, extra) -> list[str]:
    if args.nodes == 1:
        dist = ["--standalone", f"--nproc_per_node={args.gpus}"]
    else:
        dist = [f"--nnodes={args.nodes}", f"--node_rank={args.node_rank}",
                f"--nproc_per_node={args.gpus}", "--rdzv_backend=c10d",
                f"--rdzv_endpoint={args.rdzv}", f"--rdzv_id={run.name.replace('/', '-')}"]  # fmt: skip
    train = [f"experiment={run.experiment}", f"out_dir={out_dir}", f"micro_batch_size={micro}"]
    return [*torchrun_cmd(), *dist, "train.py", *train, *run.overrides, *extra]


def slurm_commands(runs: list[Run], runs_dir: str, micro: dict, args, extra) -> list[list[str]]:
    """One Hydra --multirun (submitit) command per group of runs that share their overrides."""
    groups: dict[tuple, list[str]] = {}
    for run in runs:
        groups.setdefault((micro[run.size], run.suffix, run.overrides), []).append(run.experiment)
    launcher = ["hydra/launcher=submitit_slurm", f"hydra.launcher.nodes={args.nodes}",
                f"hydra.launcher.tasks_per_node={args.gpus}",
                f"hydra.launcher.gpus_per_node={args.gpus}",
                f"hydra.launcher.timeout_min={args.slurm_time}"]  # fmt: skip
    if args.slurm_partition:
        launcher.append(f"hydra.launcher.partition={args.slurm_partition}")
    commands = []
    for (micro_batch, suffix, overrides), experiments in groups.items():
        sweep = ["--multirun", "experiment=" + ",".join(experiments)]
        train = [f"out_dir={runs_dir}/${{name}}{suffix}", f"micro_batch_size={micro_batch}"]
        commands.append([*python_cmd(), "train.py", *sweep, *train, *launcher, *overrides, *extra])
    return commands


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
MEM_HELP = (
    "GiB per GPU for the micro-batch estimate (default GPU 0's); the estimate is UNTESTED ON GPUS"
)


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Options, and the Hydra overrides after `--` (passed to every run)."""
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    ap = _Parser(
        prog="launch.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s --table {owt,fineweb,mars-m} [options] [-- hydra overrides...]",
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
        if args.gpus == 0 and not args.dry_run:
            raise LaunchError("no GPU visible; pass --gpus N (GPUs per node), or use --dry-run")
        args.gpus = args.gpus or DRY_RUN_GPUS


def select_runs(runs: list[Run], patterns: list[str] | None) -> list[Run]:
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
        max_steps = extra_max_steps(extra)
        micro = plan_micro_batches(runs, args)
    except LaunchError as e:
        print(f"launch.py: error: {e}", file=sys.stderr)
        return 2
    runs_dir = Path.cwd() / args.runs_dir if args.runs_dir else ROOT / "runs" / "paper"
    shown_dir = display_path(runs_dir.resolve())
    print(f"# commands run from {ROOT}")
    todo = []
    for run in runs:
        done, state = run_state(runs_dir / run.name, max_steps)
        cmd = torchrun_command(run, f"{shown_dir}/{run.name}", micro[run.size], args, extra)
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
                    f"launch.py: {what} failed (exit code {rc}); re-running this script skips "
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
