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
(bench/gpu_steps.py ``quarter_steps``; ``--budget`` defaults to 540 for it), every step writing its records under
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
from pathlib import Path

from bench.gpu_steps import Step, quarter_steps, steps
from runtime.config_files import ROOT

BUDGET_S = 570  # one 10-minute command, less the machine's start and the install
QUARTER_BUDGET_S = 540  # a call of the 15-minute check (--plan quarter)
STARTUP_S = 30  # this process's start, the import check and the report, out of each part
TAIL = 6000  # characters of each step's output kept in the report
LIVE_TAIL = 14  # lines of each step's output echoed to the console when it ends


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
