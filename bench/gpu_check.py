"""The first GPU hour in one command: the GPU tests and every GPU figure the docs promise, each
measurement in its own process under its own time limit, into one Markdown report written as it
goes (a step cut off by its limit, or a check cut off by its machine, keeps what it measured).

    python -m bench.gpu_check                      # on the GPU machine (no network needed)
    scripts/gpu_check.sh --out runs/gpu_check.md   # the same
    python -m bench.gpu_check --dry-run            # the steps, their limits and parts
    python -m bench.gpu_check --part 2             # the steps that did not fit the first budget
    python -m bench.gpu_check --cpu                # the same steps, tiny and on the CPU
    python -m bench.gpu_check --only small-adamw xl-mars-adamw
    python -m bench.gpu_check --nanogpt ~/nanoGPT  # adds nanoGPT side by side (a checkout)

First the import check (``bench.preflight``): a missing package stops the check before any step,
with one line per package and the command that brings it (docs/offline-install.md). Then the steps,
most valuable first: the GPU tests (``pytest -m gpu``); the optimizer engine per family against
torch's fused AdamW with its kernels per step (``bench.optim_fused --paths foreach engine
--kernels``); with ``--nanogpt PATH``, GPT-2 small beside nanoGPT at micro-batch 12 and 32
(``bench.train --nanogpt``); tokens/s, MFU, peak memory against trainer.memory_model's estimate, the
compile (first step) and graph/break/recompile counts of GPT-2 small with each optimizer family,
one process each (``bench.train``); XL with AdamW and MARS-AdamW at the micro-batch the launcher
picks for 8 of these GPUs; exact mode's cost; each optimizer's step against torch's fused AdamW and
its share of the copy bandwidth (``bench.optim_fused``); llama-124m with AdamW, MARS-AdamW and
Muon; llama-124m trained through train.py with compile for 300 steps and ``parallel=fsdp`` under
torchrun, resumed (``bench.train_run``); Newton-Schulz's share of a MARS-M step; the checkpoint stall; the graphs per block of the
Trainer's compiled DDP layout (``bench.graphs``); the non-finite decision on host vs device.

The steps' limits are packed, in order, into parts that each fit ``--budget`` (570 s: one
10-minute command on a GPU machine, less start-up); a plain run goes on past the first part while
time is left and records the rest as not run, with the ``--part`` that takes them.

``--plan quarter`` is the check that fits 15 minutes of a GPU in calls of at most 540 s
(``quarter_steps``; ``--budget`` defaults to 540 for it), every step writing its records under
``--records`` before the next starts:

    scripts/gpu_check.sh --plan quarter --dry-run            # its parts, their limits
    scripts/gpu_check.sh --plan quarter --part 1             # first call: tests, optimizer step
    scripts/gpu_check.sh --plan quarter --part 2             # second: llama, the crossover cell

the GPU tests (the MARS-AdamW train step's host-sync test first, then the rest), the optimizer
step (torch's AdamW, MARS-AdamW's engine) at blocks 4096, 2048 and 1024, each in three processes
(``bench.optim_fused --processes 3``: wall time, the profiler's kernel time, the bytes moved),
llama-124m with AdamW, MARS-AdamW and Muon at the llama experiment's tokens per step (the
launcher's micro-batch for this GPU) and Muon's ``recommended`` routing, then the crossover's
131,072-byte cell in float32 with TF32 off (scripts/gpu_crossover.sh, the study's
``tf32: false``). ``--records DIR`` (default runs/gpu_check-records): ``gpu-check.jsonl`` (the
device's facts, then a line a step as it ends), ``gpu-tests.jsonl`` (each test's outcome, the
record bench.tables turns into README's sentence), the benchmarks' own records, the crossover's
``record.jsonl`` and archive.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from runtime.config_files import ROOT

FAMILIES = [
    "adamw",
    "mars-adamw",
    "muon",
    "mars-m",
    "lion",
    "mars-lion",
    "mars-shampoo",
    "moonlight",
]  # fmt: skip  (most asked-about first)
BUDGET_S = 570  # one 10-minute command, less the machine's start and the install
QUARTER_BUDGET_S = 540  # a call of the 15-minute check (--plan quarter)
HOST_SYNC = ("tests/test_gpu_train.py::"
             "test_train_step_with_the_device_decision_makes_no_host_sync")  # fmt: skip
QUARTER_BLOCKS = (4096, 2048, 1024)  # the engine's candidate block sizes (bench/occupancy.py)
STARTUP_S = 30  # this process's start, the import check and the report, out of each part
TAIL = 6000  # characters of each step's output kept in the report
LIVE_TAIL = 14  # lines of each step's output echoed to the console when it ends


@dataclass
class Step:
    name: str
    what: str
    argv: list[str]
    limit_s: float
    junit: Path | None = None  # pytest's outcomes, turned into gpu-tests.jsonl lines


def quarter_steps(memory_gib: float, records: Path, cpu: bool = False) -> list[Step]:
    """The 15-minute check (``--plan quarter``, module docstring), most needed first; ``cpu``:
    the same steps, tiny, on the CPU (no crossover: a CPU's is the study's own)."""
    py, dev = [sys.executable], "cpu" if cpu else "cuda"
    rec = str(records)
    pytest = [*py, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-rfEs"]
    out = [
        Step("host-sync", "the MARS-AdamW train step's host-sync test (failed on the H100)",
             [*pytest, HOST_SYNC, "--junitxml", f"{rec}/host-sync.xml"], 45,
             records / "host-sync.xml"),
        Step("gpu-tests", "every other GPU test",
             [*pytest, *(["tests/test_gpu.py"] if cpu else ["tests"]), "--deselect",
              HOST_SYNC, "--junitxml", f"{rec}/gpu-tests.xml"], 120, records / "gpu-tests.xml"),
    ]  # fmt: skip
    model = "proxy-100k" if cpu else "gpt2-small"
    size = ["--rounds", "1", "--steps", "1", "--processes", "1"] if cpu else [
        "--rounds", "3", "--steps", "5", "--processes", "3"]  # fmt: skip
    for block in QUARTER_BLOCKS:
        out.append(Step(f"optim-{block}", f"{model}'s optimizer step, engine block {block}: "
                        "torch AdamW vs MARS-AdamW, wall and kernel time, three processes",
                        [*py, "-m", "bench.optim_fused", "--device", dev, "--model", model,
                         "--only", *(["mars-adamw"] if cpu else ["adamw", "mars-adamw"]),
                         "--paths", "engine", *([] if cpu else ["--kernels"]), "--clip", "1.0",
                         *size, "--block", str(block), "--out", rec], 70))  # fmt: skip
    if cpu:
        llama, mb, accum, seq = "llama-tiny", 1, 1, ["--seq-len", "32"]
    else:
        llama, seq = "llama-124m", []
        mb, accum = experiment_batch("llama/124m-adamw")
    steps = ["--steps", "1", "--warmup", "1"] if cpu else ["--steps", "5", "--warmup", "2"]
    out.append(Step("llama", f"{llama} at the llama experiment's tokens a step ({mb} x {accum}), "
                    "AdamW, MARS-AdamW, Muon (routing recommended)",
                    [*py, "-m", "bench.train", "--device", dev, "--models", llama,
                     "--micro-batch", str(mb), "--accum", str(accum), *seq, "--no-exact",
                     "--optimizers", "adamw", "mars-adamw", "muon", "--muon-routing",
                     "recommended", *steps, "--out", rec], 170))  # fmt: skip
    if not cpu:
        limit = 200
        out.append(
            Step(
                "crossover-b131072-fp32",
                "the crossover's 131,072-byte cell, float32, TF32 off (the study's tf32: false)",
                [
                    "env",
                    f"OUT={rec}/crossover",
                    "bash",
                    "scripts/gpu_crossover.sh",
                    "--parts",
                    "b131072-fp32",
                    "--limit",
                    str(limit - 30),
                ],
                limit,
            )
        )
    return out


def launcher_micro_batch(experiment: str, memory_gib: float, gpus: int = 8) -> tuple[int, int]:
    """(micro-batch, gradient accumulation) that scripts/launch.py picks for ``experiment`` on
    ``gpus`` GPUs of ``memory_gib``: the largest divisor of the per-rank sequences that the
    launcher's own estimate (trainer.memory_plan.experiment_estimator: the Trainer's DDP
    settings) fits, so the check measures what a paper run would run."""
    from runtime.config_files import load_config
    from trainer.memory_model import fitting_micro_batch
    from trainer.memory_plan import experiment_estimator

    cfg = load_config(f"experiment/{experiment}")
    per_rank = cfg["batch_tokens"] // (cfg.get("seq_len") or cfg["model"]["block_size"]) // gpus
    divisors = [d for d in range(1, per_rank + 1) if per_rank % d == 0]
    b = fitting_micro_batch(divisors, memory_gib, experiment_estimator([experiment], gpus)) or 1
    return b, per_rank // b


def experiment_batch(experiment: str, gpus: int = 1) -> tuple[int, int]:
    """(micro-batch, gradient accumulation) of ``experiment`` as it sets them on ``gpus`` GPUs:
    its micro_batch_size, and the accumulation that makes its batch_tokens a step."""
    from runtime.config_files import load_config

    cfg = load_config(f"experiment/{experiment}")
    per_rank = cfg["batch_tokens"] // (cfg.get("seq_len") or cfg["model"]["block_size"]) // gpus
    mb = cfg["micro_batch_size"]
    return mb, per_rank // mb


def xl_micro_batch(memory_gib: float) -> int:
    """The micro-batch the launcher picks for XL with MARS-AdamW on 8 GPUs of ``memory_gib``."""
    return launcher_micro_batch("fineweb-edu/xl-mars-adamw", memory_gib)[0]


def steps(memory_gib: float, cpu: bool = False, nanogpt: Path | None = None) -> list[Step]:
    """Every step, most valuable first; ``cpu``: the same steps, tiny, on the CPU; ``nanogpt``:
    a nanoGPT checkout for the side-by-side steps (``nanogpt_steps``)."""
    py, dev = [sys.executable], "cpu" if cpu else "cuda"
    small, big = ("tiny", "tiny") if cpu else ("gpt2-small", "gpt2-xl")
    # the papers' per-GPU step on 8 GPUs: small at its micro-batch 15 with 4 micro-batches per
    # optimizer step (480 sequences); XL at the launcher's micro-batch for this GPU's memory
    xl, xl_accum = (1, 1) if cpu else launcher_micro_batch("fineweb-edu/xl-mars-adamw", memory_gib)
    accum = ["--accum", "1" if cpu else "4"]
    short = (
        ["--steps", "1", "--warmup", "1", "--rounds", "1"]
        if cpu
        else ["--steps", "5", "--warmup", "2"]
    )
    train = [*py, "-m", "bench.train", "--device", dev, *short]
    tests = ["tests/test_gpu.py"] if cpu else ["tests"]
    out = [Step("gpu-tests", "pytest -m gpu", [*py, "-m", "pytest", "-q", "-m", "gpu", *tests],
                130)]  # fmt: skip
    out.append(engine_step(py, dev, small, cpu))
    out += nanogpt_steps(train, nanogpt, small, cpu) if nanogpt else []
    out += [] if cpu else sdpa_steps(train, small)
    for i, name in enumerate(FAMILIES):  # the first compiles the model; the others hit its cache
        lim = 75 if i == 0 else 100 if name == "mars-adamw" else 60
        out.append(Step(f"small-{name}", f"{small}, {name}", [*train, "--models", small,
                        *accum, "--no-exact", "--optimizers", name], lim))  # fmt: skip
    for name in ("adamw", "mars-adamw"):
        out.append(Step(f"xl-{name}", f"{big} at micro-batch {xl} x {xl_accum}, {name}",
                        [*train, "--models", big, "--no-exact", "--optimizers", name,
                         "--micro-batch", str(xl), "--accum", str(xl_accum)], 110))  # fmt: skip
    opt_dev = ["--device", dev, "--model", small]
    out += [
        Step("exact", f"{small}, MARS-AdamW approx and exact: exact mode's cost",
             [*train, "--models", small, *accum, "--exact", "--optimizers", "mars-adamw"], 90),
        Step("xl-estimate", "the XL estimate part by part",
             [*py, "-m", "bench.memory", "--parts", "--models", big, "--optimizers", "adamw",
              "mars-adamw", "--micro-batch", str(xl)], 20),
        Step("llama", f"{'llama-tiny' if cpu else 'llama-124m'} at micro-batch 12: AdamW, "
             "MARS-AdamW, Muon (targets: MARS-AdamW within 3%, Muon within 15% of AdamW)",
             [*train, "--models", "llama-tiny" if cpu else "llama-124m", "--micro-batch",
              "1" if cpu else "12", "--accum", "1", "--no-exact", "--optimizers", "adamw",
              "mars-adamw", "muon"], 150),
        *train_run_steps(py, dev, cpu),
        Step("optim-fused", "optimizer steps vs fused AdamW, copy bandwidth",
             [*py, "-m", "bench.optim_fused", *opt_dev, "--only", "adamw", "mars-adamw",
              "mars-lion", "lion", "--paths", "foreach", "compiled", "--rounds",
              "1" if cpu else "3"], 80),
        Step("newton-schulz", "Newton-Schulz's share of a MARS-M step",
             [*py, "-m", "bench.newton_schulz", "--device", dev, "--model", small,
              *(["--layers", "1"] if cpu else [])], 45),
        Step("checkpoint", "the checkpoint stall",
             [*py, "-m", "bench.checkpoint", *opt_dev, "--saves", "1" if cpu else "2"], 45),
        Step("graphs", "graphs per block of the Trainer's compiled DDP layout",
             [*py, "-m", "bench.graphs", "--model", small], 40),
        Step("nonfinite", "the non-finite check decided on the host vs on the device",
             [*py, "-m", "bench.nonfinite", *opt_dev, "--micro-batch", "8", "--optimizer",
              "mars-adamw", "--rounds", "1" if cpu else "3"], 50),
        Step("nonfinite-muon", "the same for Muon (device: steps on copies, optim/masked.py)",
             [*py, "-m", "bench.nonfinite", *opt_dev, "--micro-batch", "8", "--optimizer",
              "muon", "--rounds", "1" if cpu else "3"], 50),
    ]  # fmt: skip
    return out


def engine_step(py: list[str], dev: str, small: str, cpu: bool) -> Step:
    """The optimizer engine (optim/engine/) per family against torch's fused AdamW: ms per step,
    share of the copy bandwidth, GPU kernels per step, each step with the trainer's global clip
    (folded into the engine where it can: optim/engine/clip.py). Targets: MARS-AdamW at most
    1.5x fused AdamW and 70% of the copy bandwidth; at most 10 kernels for an element-wise
    optimizer. On the CPU: one family on a small-vocabulary model (Triton's interpreter is
    slow)."""
    if cpu:
        argv = [*py, "-m", "bench.optim_fused", "--device", "cpu", "--model", "proxy-100k",
                "--only", "mars-adamw", "--paths", "foreach", "engine", "--rounds", "1",
                "--steps", "1"]  # fmt: skip
    else:
        argv = [*py, "-m", "bench.optim_fused", "--device", dev, "--model", small, "--only",
                "adamw", "mars-adamw", "mars-adamw-exact", "mars-lion", "lion", "ademamix",
                "adamw-schedulefree", "muon", "mars-m", "--paths", "foreach", "engine",
                "--kernels", "--rounds", "3", "--clip", "1.0"]  # fmt: skip
    return Step("optim-engine", "the optimizer engine per family vs fused AdamW", argv, 120)


def nanogpt_steps(train: list[str], nanogpt: Path, small: str, cpu: bool) -> list[Step]:
    """nanoGPT's model.py and step beside ours in one process (``bench.train --nanogpt``), at
    micro-batch 12 and 32 (target: at least 1.10x nanoGPT's tokens/s, MFU at least 50% at 32)."""
    out = []
    for mb, opts in (("12", ["adamw", "mars-adamw"]), ("32", ["adamw"])):
        out.append(Step(f"nanogpt-{mb}", f"{small} at micro-batch {mb} beside nanoGPT",
                        [*train, "--models", small, "--micro-batch", "1" if cpu else mb,
                         "--accum", "1", "--no-exact", "--optimizers", *opts, "--nanogpt",
                         str(nanogpt)], 150))  # fmt: skip
    return out


def sdpa_steps(train: list[str], small: str) -> list[Step]:
    """GPT-2 small with only the flash, then only the cuDNN attention kernel (which to choose:
    cuDNN where it is faster and equal within bf16 noise)."""
    return [Step(f"sdpa-{backend}", f"{small} at micro-batch 12, AdamW, SDPA {backend}",
                 [*train, "--models", small, "--micro-batch", "12", "--accum", "1", "--no-exact",
                  "--optimizers", "adamw", "--sdpa-backend", backend], 75)
            for backend in ("flash", "cudnn")]  # fmt: skip


def train_run_steps(py: list[str], dev: str, cpu: bool) -> list[Step]:
    """train.py itself (bench.train_run): llama-124m compiled for 300 steps with MARS-AdamW and
    Muon (the loss falls, nothing recompiles), then ``parallel=fsdp`` under torchrun, resumed
    from its DCP checkpoint (one GPU: one rank, the path and not the sharding)."""
    out = Path(tempfile.gettempdir()) / f"train_run-{os.getpid()}"  # fresh for every check
    size = (["--micro-batch", "2", "--accum", "1", "--seq-len", "32", "--eval-tokens", "256"]
            if cpu else [])  # fmt: skip
    runs = [*py, "-m", "bench.train_run", "--device", dev, "--out", str(out), *size]
    llama = ["llama-cpu/tiny-mars-adamw", "llama-cpu/tiny-muon"] if cpu else [
        "llama/124m-mars-adamw", "llama/124m-muon"]  # fmt: skip
    return [
        Step("llama-train", "llama-124m trained with compile, MARS-AdamW and Muon: the loss "
             "falls, no recompiles", [*runs, "--steps", "6" if cpu else "300", "--experiments",
                                      *llama], 240),
        Step("fsdp", "parallel=fsdp under torchrun on one GPU, stopped and resumed from DCP",
             [*runs, "--steps", "4" if cpu else "60", "--fsdp", "--no-compile", "--experiments", llama[0]], 120),
    ]  # fmt: skip


def parts(all_steps: list[Step], budget: float) -> list[list[Step]]:
    """The steps, in order, packed into parts whose limits add up to ``budget - STARTUP_S``."""
    room, out = budget - STARTUP_S, [[]]
    for s in all_steps:
        if s.limit_s > room:
            raise SystemExit(
                f"gpu_check: step {s.name} needs {s.limit_s:.0f} s, more than a "
                f"budget of {budget:.0f} s leaves ({room:.0f} s); raise --budget"
            )
        if sum(t.limit_s for t in out[-1]) + s.limit_s > room:
            out.append([])
        out[-1].append(s)
    return out


def run_step(step: Step, limit_s: float, log: Path | None = None) -> dict:
    """Run one step in its own process group, its output into ``log`` (a temporary file when
    None); never raises: a failure or a timeout is a result with whatever the step printed
    until then (children run unbuffered). What the step leaves running is ended with it."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        path = log or Path(tmp) / "out.log"
        with open(path, "wb") as f:
            proc = subprocess.Popen(step.argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True)  # fmt: skip
            try:
                proc.wait(timeout=max(limit_s, 1))
                status, rc = ("ok" if proc.returncode == 0 else "failed"), proc.returncode
            except subprocess.TimeoutExpired:
                status, rc = f"timed out after {limit_s:.0f} s", None
            _kill_group(proc)
        text = path.read_bytes().decode(errors="replace")
    return dict(step=step, status=status, rc=rc, seconds=time.perf_counter() - t0, output=text)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the step's whole group (torchrun, compile workers), then SIGKILL what stays."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        if sig == signal.SIGTERM:
            time.sleep(0.2)  # a group whose leader exited may still hold workers


def _cmd(argv: list[str]) -> str:
    return " ".join(a if a != sys.executable else "python" for a in argv)


def report(results: list[dict], device: str, not_run: list[tuple[Step, str]] = ()) -> str:
    """The Markdown report: device, torch, then each step's command, status and output."""
    import torch

    lines = ["# GPU check", "", f"- {device}", f"- torch {torch.__version__}, "
             f"CUDA {torch.version.cuda}", f"- {time.strftime('%Y-%m-%d %H:%M:%S')}", "",
             "| step | status | seconds | limit |", "|---|---|---|---|"]  # fmt: skip
    lines += [f"| {r['step'].name} | {r['status']} | {r['seconds']:.0f} | "
              f"{r['step'].limit_s:.0f} |" for r in results]  # fmt: skip
    lines += [f"| {s.name} | not run: {why} | - | {s.limit_s:.0f} |" for s, why in not_run]
    for r in results:
        lines += ["", f"## {r['step'].name}: {r['step'].what}", "",
                  f"`{_cmd(r['step'].argv)}`: {r['status']}", "", "```",
                  r["output"][-TAIL:].rstrip(), "```"]  # fmt: skip
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "gpu_check.md")
    ap.add_argument(
        "--logs",
        type=Path,
        default=None,
        help="each step's whole output (default: beside --out, in OUT-logs/)",
    )
    ap.add_argument("--dry-run", action="store_true", help="list the steps, run nothing")
    ap.add_argument("--cpu", action="store_true", help="the same steps, tiny, on the CPU")
    ap.add_argument("--only", nargs="+", metavar="STEP", help="these steps only")
    ap.add_argument("--part", type=int, default=None, help="this part only (see --dry-run)")
    ap.add_argument(
        "--limit",
        nargs="+",
        default=[],
        metavar="STEP=SECONDS",
        help="another time limit for these steps",
    )
    ap.add_argument(
        "--budget",
        type=float,
        default=None,
        help=f"seconds a part's steps may take (default {BUDGET_S}; "
        f"--plan quarter: {QUARTER_BUDGET_S})",
    )
    ap.add_argument(
        "--plan",
        choices=["hour", "quarter"],
        default="hour",
        help="hour: every figure; quarter: the 15-minute check (module docstring)",
    )
    ap.add_argument(
        "--records",
        type=Path,
        default=ROOT / "runs" / "gpu_check-records",
        help="where the steps' records go (--plan quarter)",
    )
    ap.add_argument("--skip-preflight", action="store_true", help="no import check first")
    ap.add_argument(
        "--nanogpt",
        type=Path,
        default=None,
        metavar="PATH",
        help="a nanoGPT checkout: adds the side-by-side steps (bench.train)",
    )
    args = ap.parse_args(argv)
    if args.budget is None:
        args.budget = QUARTER_BUDGET_S if args.plan == "quarter" else BUDGET_S
    return args


def select(args: argparse.Namespace, memory_gib: float) -> tuple[list[list[Step]], list[Step]]:
    """(all parts, the steps to run) for --only / --part."""
    if getattr(args, "plan", "hour") == "quarter":
        every = quarter_steps(memory_gib, args.records, cpu=args.cpu)
    else:
        every = steps(memory_gib, cpu=args.cpu, nanogpt=args.nanogpt)
    names = [s.name for s in every]
    for item in args.limit:
        name, _, secs = item.partition("=")
        if name not in names or not secs.replace(".", "", 1).isdigit():
            raise SystemExit(f"gpu_check: --limit {item!r}: want STEP=SECONDS, STEP one of "
                             f"{', '.join(names)}")  # fmt: skip
        next(s for s in every if s.name == name).limit_s = float(secs)
    if args.only:
        unknown = sorted(set(args.only) - set(names))
        if unknown:
            raise SystemExit(f"gpu_check: unknown step(s) {unknown}; the steps: {', '.join(names)}")
        every = [s for s in every if s.name in args.only]
    packed = parts(every, args.budget)
    if args.part is not None:
        if not 1 <= args.part <= len(packed):
            raise SystemExit(f"gpu_check: --part {args.part}; there are parts 1 to {len(packed)}")
        return packed, packed[args.part - 1]
    return packed, every


def dry_run(packed: list[list[Step]], budget: float) -> None:
    for i, part in enumerate(packed, 1):
        total = sum(s.limit_s for s in part)
        print(f"part {i}: {len(part)} steps, limits {total:.0f} s + {STARTUP_S} s start-up "
              f"<= budget {budget:.0f} s")  # fmt: skip
        for s in part:
            print(f"  {s.name} ({s.limit_s:.0f} s): {s.what}\n      {_cmd(s.argv)}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    cuda = torch.cuda.is_available() and not args.cpu
    if not cuda and not (args.cpu or args.dry_run):
        raise SystemExit("gpu_check: no GPU visible; use --dry-run (list) or --cpu (tiny, CPU)")
    if not (args.dry_run or args.skip_preflight):
        from bench import preflight

        gone = preflight.missing()
        if gone:
            print("\n".join(preflight.report(gone)))
            return 2
    mem = torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda else 80.0
    packed, todo = select(args, mem)
    if args.dry_run:
        dry_run(packed, args.budget)
        return 0
    return run_all(todo, packed, args, "cuda" if cuda else "cpu")


def note(records: Path, line: dict, name: str = "gpu-check.jsonl") -> None:
    """One JSON line appended to ``records/name``, on disk at once."""
    import json

    with open(records / name, "a") as f:
        f.write(json.dumps(line) + "\n")
        f.flush()
        os.fsync(f.fileno())


def device_facts_line(device: str) -> dict:
    from bench import record

    return {**record.device_facts(device), **record.provenance()}


def keep_step(records: Path, s: Step, r: dict, before: set) -> None:
    """For a pytest step, each test's outcome in gpu-tests.jsonl; then the step's line in
    gpu-check.jsonl (status, seconds, limit, command, the files it wrote)."""
    if s.junit is not None:
        tests = junit_lines(s.junit)
        if not (records / "gpu-tests.jsonl").exists():
            facts = device_facts_line("cuda")
            note(
                records,
                {
                    "event": "about",
                    "what": "pytest -m gpu by bench.gpu_check on one "
                    f"{facts['gpu']}, {facts['time_utc'][:10]}",
                },
                "gpu-tests.jsonl",
            )
            note(records, {"event": "device", **facts}, "gpu-tests.jsonl")
        note(records, {"event": "gpu-tests", "step": s.name, "rc": r["rc"],
                       "seconds": round(r["seconds"], 1), "command": _cmd(s.argv)},
             "gpu-tests.jsonl")  # fmt: skip
        for t in tests:
            note(records, {"event": "test", "call": 1, **t}, "gpu-tests.jsonl")
    new = sorted(str(p.relative_to(records)) for p in set(records.rglob("*")) - before
                 if p.is_file())  # fmt: skip
    note(records, {"event": "step", "step": s.name, "what": s.what, "status": r["status"],
                   "rc": r["rc"], "seconds": round(r["seconds"], 1), "limit_s": s.limit_s,
                   "command": _cmd(s.argv).replace(str(ROOT) + "/", ""), "files": new})  # fmt: skip


def junit_lines(path: Path) -> list[dict]:
    """Each test case of a pytest junit XML: test, outcome, seconds, message (none if absent:
    a step killed before pytest wrote it)."""
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return []
    out = []
    for case in root.iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed", "error": "failed", "skipped": "skipped"}[tag]
                message = (el.get("message") or "").splitlines()[0][:300] if el.get("message") \
                    else ""  # fmt: skip
                break
        out.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                    "seconds": float(case.get("time") or 0), "message": message})  # fmt: skip
    return out


def run_all(todo: list[Step], packed: list[list[Step]], args, device: str) -> int:
    """Run the steps in order within the budget, rewriting the report after each one."""
    from bench.harness import device_line

    dev_line = device_line(device)
    logs = args.logs or args.out.with_name(args.out.stem + "-logs")
    logs.mkdir(parents=True, exist_ok=True)
    deadline, results = time.monotonic() + args.budget - STARTUP_S, []
    print(dev_line, flush=True)
    records = getattr(args, "records", None)
    if records is not None:
        records.mkdir(parents=True, exist_ok=True)
        note(records, {"event": "device", **device_facts_line(device)})
    for i, s in enumerate(todo):
        left = deadline - time.monotonic()
        if left < min(s.limit_s, 20):
            part = next(k for k, p in enumerate(packed, 1) if s in p)
            why = f"budget spent; run it with --part {part}"
            args.out.write_text(report(results, dev_line, [(t, why) for t in todo[i:]]))
            print(f"{len(todo) - i} steps not run: {why}")
            break
        before = set(records.rglob("*")) if records is not None else set()
        r = run_step(s, min(s.limit_s, left), logs / f"{s.name}.log")
        results.append(r)
        if records is not None:  # this step's record, before the next step starts
            keep_step(records, s, r, before)
        tail = "\n".join(r["output"].rstrip().splitlines()[-LIVE_TAIL:])
        print(f"== {s.name}: {r['status']} ({r['seconds']:.0f} s of {s.limit_s:.0f})\n{tail}",
              flush=True)  # fmt: skip
        args.out.write_text(report(results, dev_line))
    print(f"report: {args.out}")
    return 0 if results and all(r["status"] == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
