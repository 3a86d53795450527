"""Where a ``--multirun`` sweep goes: one parent directory named by the command line
(``runs/<name>-sweep[_<overrides every job shares>]``), one directory per job named by its swept
values. No time stamp: the same sweep command names the same directories, so relaunching it
continues its unfinished jobs and leaves its finished ones as they are.

trainer/command_line.py registers these as OmegaConf resolvers for ``hydra.sweep.dir`` and
``hydra.sweep.subdir`` (configs/config.yaml). Hydra resolves those again inside every job, with
that job's values, and the submitit launcher's jobs run in other processes: so the launching
process's layout (the swept keys, the parent directory) is kept in the environment, which those
jobs inherit.
"""

from __future__ import annotations

import json
import os

from trainer.rundir import run_dir_name, sweep_job_dir_name

SWEEP_ENV = "MARS_GPT2_SWEEP"


def _layout() -> dict:
    return json.loads(os.environ.get(SWEEP_ENV, "{}"))


def record_swept_keys(swept: list[str]) -> None:
    """Note, in the launching process, which keys a ``--multirun`` sweeps (``optimizer.lr``)."""
    os.environ[SWEEP_ENV] = json.dumps({"swept": sorted(swept)})


def _key(override: object) -> str:
    return str(override).lstrip("+~").split("=")[0]


def sweep_dir(name: str, overrides: list[str]) -> str:
    """``hydra.sweep.dir``: ``runs/<name>-sweep[_<overrides every job shares>]``, or
    ``runs/sweep[...]`` when the experiment, optimizer or name itself is swept (the ``-sweep``
    keeps a sweep's parent apart from the single run of the same command)."""
    layout = _layout()
    if "dir" not in layout:
        swept = set(layout.get("swept", []))
        common = [str(o) for o in overrides if _key(o) not in swept]
        base = "sweep" if {"experiment", "optimizer", "name"} & swept else f"{name}-sweep"
        layout["dir"] = run_dir_name(base, common)
        os.environ[SWEEP_ENV] = json.dumps(layout)
    return layout["dir"]


def sweep_job_dir(overrides: list[str], job_num: int) -> str:
    """``hydra.sweep.subdir``: the job's values of the swept keys (``optimizer.lr=0.003``)."""
    swept = _layout().get("swept")
    chosen = [str(o) for o in overrides if swept is None or _key(o) in swept]
    return sweep_job_dir_name(chosen, job_num)
