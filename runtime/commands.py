"""The one builder of ``train.py`` command lines, for everything that launches runs (the paper
launcher, the CPU scaling study, the optimizer study).

A command is ``[*processes, "train.py", ("--multirun"), *overrides]``: ``processes`` is this
Python (one process) or torchrun (``torchrun(...)``: one node or several); a ``--multirun`` with
``hydra_launcher(...)`` among the overrides sends the jobs to Slurm (or to local processes) through
Hydra's submitit launcher. The overrides' order is the caller's. Commands run from the repository
root. Standard library only.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

TRAIN = "train.py"


def _exe(name: str) -> str | None:
    """This Python's ``name`` script: plain ``name`` when PATH finds that one, else its path."""
    sibling = Path(sys.executable).parent / name
    if not sibling.exists():
        return None
    on_path = shutil.which(name)  # same directory, not same target: a venv's python is a link
    same = on_path and Path(on_path).parent.resolve() == sibling.parent.resolve()
    return name if same else str(sibling)


def python_exe() -> list[str]:
    """This Python (``python`` when PATH finds it)."""
    return [_exe("python") or sys.executable]


def torchrun_exe() -> list[str]:
    """This Python's torchrun, or ``python -m torch.distributed.run``."""
    exe = _exe("torchrun")
    return [exe] if exe else [*python_exe(), "-m", "torch.distributed.run"]


def torchrun(nproc: int, *, nodes: int = 1, node_rank: int | None = None,
             rdzv: str | None = None, rdzv_id: str | None = None) -> list[str]:  # fmt: skip
    """torchrun with ``nproc`` processes per node: standalone on one node, else a c10d
    rendezvous at ``rdzv`` (node 0's HOST:PORT) as ``node_rank`` of ``nodes``."""
    if nodes == 1:
        dist = ["--standalone", f"--nproc_per_node={nproc}"]
    else:
        dist = [f"--nnodes={nodes}", f"--node_rank={node_rank}", f"--nproc_per_node={nproc}",
                "--rdzv_backend=c10d", f"--rdzv_endpoint={rdzv}",
                f"--rdzv_id={rdzv_id}"]  # fmt: skip
    return [*torchrun_exe(), *dist]


def hydra_launcher(name: str, *, sweep_dir: str | Path | None = None, **settings) -> list[str]:
    """The overrides that choose Hydra's launcher ``name`` (``submitit_slurm``,
    ``submitit_local``) with its ``settings`` (``nodes=2`` -> ``hydra.launcher.nodes=2``; a None
    is left out), after the sweep's directory when given."""
    out = [f"hydra.sweep.dir={sweep_dir}"] if sweep_dir is not None else []
    out.append(f"hydra/launcher={name}")
    out += [f"hydra.launcher.{k}={v}" for k, v in settings.items() if v is not None]
    return out


def train_command(overrides: Sequence[str], *, processes: Sequence[str] | None = None,
                  multirun: bool = False) -> list[str]:  # fmt: skip
    """``train.py`` with ``overrides``, run by ``processes`` (default: this Python, one
    process); ``multirun``: a Hydra ``--multirun`` (a sweep, or jobs for a Hydra launcher)."""
    head = list(processes) if processes is not None else python_exe()
    return [*head, TRAIN, *(["--multirun"] if multirun else []), *overrides]
