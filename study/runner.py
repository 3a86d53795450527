"""How the study's runs are launched: one ``train.py`` command per run, on this machine
(``--jobs`` commands at a time), on a GPU node (``--nproc N``: each command under torchrun, or
``--device cuda`` with several commands sharing one GPU) or on Slurm (``--launcher slurm``:
Hydra's submitit launcher).

A run is finished when its summary has as many steps as asked (runtime/runfiles.py); any other run is in the
next command, and train.py continues it from its checkpoint (resume=auto), so the study command
started again picks up where it stopped.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import signal
import subprocess
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from runtime import commands, runfiles

log = logging.getLogger("study")
ROOT = Path(__file__).resolve().parent.parent
LAUNCHERS = ("local", "submitit_local", "slurm")


@dataclass(frozen=True)
class Run:
    """One training run: its overrides (everything but out_dir) and where it goes."""

    overrides: tuple[str, ...]
    out_dir: Path
    max_steps: int


def result(run_dir: Path, max_steps: int) -> dict | None:
    """The summary of a finished run (None: not finished): the run directory's own rule."""
    return runfiles.finished(run_dir, max_steps)


def command(run: Run, *, launcher: str, nproc: int) -> list[str]:
    """The ``train.py`` command of one run: a plain one on this machine, a one-job
    ``--multirun`` through Hydra's submitit launcher on Slurm (or submitit_local)."""
    processes = commands.torchrun(nproc) if nproc > 1 else None
    overrides = [*run.overrides, f"out_dir={run.out_dir}"]
    if launcher != "local":
        name = "submitit_slurm" if launcher == "slurm" else "submitit_local"
        overrides += commands.hydra_launcher(name, sweep_dir=run.out_dir.parent / ".sweep")
    return commands.train_command(overrides, processes=processes, multirun=launcher != "local")


LIVE: set[subprocess.Popen] = set()  # the train.py processes running now


def stop_all() -> int:
    """Ask every running train.py to stop (SIGTERM: it checkpoints and exits, train.py's
    preemption path); how many were asked."""
    procs = list(LIVE)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    return len(procs)


def execute(commands: list[list[str]], *, jobs: int, threads: int, dry_run: bool,
            log_file: Path | None = None) -> list[int]:  # fmt: skip
    """Run ``commands``, ``jobs`` at a time, each with ``threads`` CPU threads; their exit
    codes. Output goes to ``log_file`` (appended) when given."""
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return [rc for rc, _ in pool.map(lambda cmd: launch(cmd, threads=threads, dry_run=dry_run,
                                                            log_file=log_file), commands)]  # fmt: skip


TAIL_LINES = 40  # the last lines of a command's output kept to say why it failed


def launch(cmd: list[str], *, threads: int, dry_run: bool,
           log_file: Path | None = None) -> tuple[int, str]:  # fmt: skip
    """Run one command with ``threads`` CPU threads, its output appended to ``log_file`` line
    by line (several commands share it); its exit code and the last lines it printed (the
    reason a failed command gives: ``failure_reason``)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    log.info("+ %s", shlex.join(cmd))
    if dry_run:
        return 0, ""
    t0 = time.perf_counter()
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    with open(log_file or os.devnull, "a", encoding="utf-8", errors="replace") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)  # fmt: skip
        LIVE.add(proc)
        try:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.decode("utf-8", errors="replace")
                out.write(line)
                out.flush()
                tail.append(line.rstrip("\n"))
            rc = proc.wait()
        finally:
            LIVE.discard(proc)
    log.info("  exit %d after %.0f s", rc, time.perf_counter() - t0)
    return rc, "\n".join(tail)


def launch_each(commands: list[list[str]], *, threads: int, dry_run: bool,
                log_file: Path | None = None) -> tuple[int, str]:  # fmt: skip
    """``launch`` each command in turn until one fails: the last exit code and output."""
    rc, tail = 0, ""
    for cmd in commands:
        rc, tail = launch(cmd, threads=threads, dry_run=dry_run, log_file=log_file)
        if rc:
            break
    return rc, tail


SIGNAL_EXITS = (124, 130, 137, 143)  # requeue (train.py's preemption), Ctrl-C, SIGKILL, SIGTERM
_STAMP = re.compile(r"^\d\d:\d\d:\d\d\s+")  # the log format's time stamp (trainer/logs.py)


def failure_reason(tail: str) -> str:
    """The reason a failed command gave: the last line it printed that says something (train.py
    ends a refusal with one line, a traceback with the exception's), its time stamp dropped."""
    for line in reversed(tail.splitlines()):
        line = _STAMP.sub("", line.strip())
        if line and not set(line) <= set("^~-=| "):
            return line[:300]
    return "it printed nothing"


def by_signal(rc: int) -> bool:
    """Whether an exit code is a stop (a signal, a requeue), not an error of the run."""
    return rc < 0 or rc in SIGNAL_EXITS


def check_overrides(overrides: list[str], *, dry_run: bool = False) -> None:
    """The checks train.py makes of its command line and its composed config (every key known,
    every value of its type and range, the device and dtype: ``trainer.command_line.check_command_line``,
    ``compose_typed``), made here before a study schedules anything: a ValueError of one
    line (``config error: ...``) where train.py would refuse. ``out_dir`` is left out (a run's
    own); a dry run accepts ``device=cuda`` on a machine without CUDA (it plans a GPU node's
    commands) after checking the word."""
    import sys

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from trainer import command_line

    ours = [o for o in overrides if not o.startswith("out_dir=")]
    devices = [o.split("=", 1)[1] for o in ours if o.startswith("device=")]
    if dry_run and devices and devices[-1] == "cuda":
        import torch

        if not torch.cuda.is_available():
            ours = [o for o in ours if not o.startswith("device=")] + ["device=cpu"]
    try:
        command_line.check_command_line(ours)
        command_line.check_composition(ours)  # a value of the wrong type: one line
        command_line.compose_typed(ours)  # every value in range, the device, the dtype
    except SystemExit as exc:
        raise ValueError(
            str(exc.code).strip().splitlines()[0] if exc.code else "config error"
        ) from None
