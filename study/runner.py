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
import shlex
import signal
import subprocess
import time
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
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}

    def one(cmd: list[str]) -> int:
        log.info("+ %s", shlex.join(cmd))
        if dry_run:
            return 0
        t0 = time.perf_counter()
        with open(log_file or os.devnull, "a") as out:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
            LIVE.add(proc)
            try:
                rc = proc.wait()
            finally:
                LIVE.discard(proc)
        log.info("  exit %d after %.0f s", rc, time.perf_counter() - t0)
        return rc

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, commands))
