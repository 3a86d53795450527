"""A run directory that survives restarts: the launch time that names it stays the same.

``torchrun --max-restarts=K`` starts new worker processes after a failure, and
``resume=auto`` continues from the newest checkpoint only if they write to the same run
directory. Its default name ends with the launch time, so the launch time must not be the
restarted workers' clock. In order of preference it is:

1. ``MARS_GPT2_LAUNCH_TIME`` when set (any string; a Slurm script can export it once per job,
   or give ``out_dir=`` explicitly);
2. under torchrun (``TORCHELASTIC_RUN_ID`` set), the start time of the torchrun agent that
   started this worker (its parent process), which restarts keep; Linux (``/proc``) only;
3. now.

Every rank then takes rank 0's value (``trainer.sweeps.launch_time``).
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

LAUNCH_TIME_ENV = "MARS_GPT2_LAUNCH_TIME"
_FORMAT = "%Y-%m-%d_%H-%M-%S"


def process_start_time(pid: int) -> datetime.datetime | None:
    """When process ``pid`` started (from /proc; None elsewhere or when unreadable)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, after the command name
        seconds = boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return datetime.datetime.fromtimestamp(int(seconds))


def launch_stamp() -> str:
    """The launch time that names a run directory, the same across torchrun restarts."""
    if os.environ.get(LAUNCH_TIME_ENV):
        return os.environ[LAUNCH_TIME_ENV]
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        started = process_start_time(os.getppid())
        if started is not None:
            return started.strftime(_FORMAT)
    return datetime.datetime.now().strftime(_FORMAT)
