"""How the study's runs are launched: ``train.py --multirun`` (the sweep path), one command per
group of runs that differ only in the swept values, on this machine (``--jobs`` commands at a
time), on a GPU node (``--nproc N``: each command under torchrun) or on Slurm (``--launcher
slurm``: Hydra's submitit launcher, every job of a command submitted at once).

A run is finished when its ``summary.json`` has as many steps as asked; any other run is in the
next command, and train.py continues it from its checkpoint (resume=auto), so the study command
started again picks up where it stopped.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("study")
ROOT = Path(__file__).resolve().parent.parent
LAUNCHERS = ("local", "submitit_local", "slurm")


@dataclass(frozen=True)
class Run:
    """One training run: its fixed overrides, its swept values and where it goes."""

    fixed: tuple[str, ...]  # overrides shared with the other runs of its group
    values: tuple[tuple[str, str], ...]  # (key, value) swept by the group's command
    names: tuple[str, ...]  # the keys that spell its directory's name (run_name)
    out_dir: Path
    max_steps: int


def run_name(values: dict[str, object], names: tuple[str, ...]) -> str:
    """A run directory's name, ``lr-0.004_seed-1``: each key's last part and its value as
    OmegaConf prints it into the command's out_dir (``str``), so both spell it alike."""
    return "_".join(f"{k.rsplit('.', 1)[-1]}-{values[k]}" for k in names)


def result(run_dir: Path, max_steps: int) -> dict | None:
    """The summary of a finished run (None: not finished)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if summary.get("steps", 0) >= max_steps else None


def group(runs: list[Run], size: int) -> list[list[Run]]:
    """Runs with the same fixed overrides and swept keys, in commands of at most ``size``."""
    by_key: dict = {}
    for r in runs:
        by_key.setdefault((r.fixed, tuple(k for k, _ in r.values)), []).append(r)
    out = []
    for members in by_key.values():
        out += [members[i : i + size] for i in range(0, len(members), size)]
    return out


def command(runs: list[Run], *, launcher: str, nproc: int) -> list[str]:
    """One ``train.py --multirun`` command over ``runs`` (one group). Each job's out_dir is
    spelt from its own values, so Hydra's zip of the swept lists is not needed: the sweep is the
    product of one list per key, and a group only holds runs whose product is themselves."""
    keys = [k for k, _ in runs[0].values]
    lists = {k: sorted({v for r in runs for kk, v in r.values if kk == k}) for k in keys}
    n_product = 1
    for v in lists.values():
        n_product *= len(v)
    if n_product != len(runs):
        raise AssertionError("a command's runs must be the product of their swept values")
    parent = runs[0].out_dir.parent
    name = "_".join(f"{k.rsplit('.', 1)[-1]}-${{{k}}}" for k in runs[0].names)
    exe = (
        [sys.executable]
        if nproc <= 1
        else ["torchrun", "--standalone", f"--nproc_per_node={nproc}"]
    )
    cmd = [*exe, "train.py", "--multirun", *runs[0].fixed]
    cmd += [f"{k}={','.join(lists[k])}" for k in keys]
    cmd += [f"out_dir={parent}/{name}", f"hydra.sweep.dir={parent}/.sweep"]
    if launcher == "slurm":
        cmd.append("hydra/launcher=submitit_slurm")
    elif launcher == "submitit_local":
        cmd.append("hydra/launcher=submitit_local")
    return cmd


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
            rc = subprocess.call(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        log.info("  exit %d after %.0f s", rc, time.perf_counter() - t0)
        return rc

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, commands))
