"""Stop cleanly when the cluster says so: SIGTERM or SIGUSR1 ends the run at a step boundary.

Slurm sends SIGTERM before it kills a job (at its time limit, on preemption, on ``scancel``),
and SIGUSR1 ahead of time when asked (``#SBATCH --signal=USR1@120``); torchrun's agent forwards
the signal it receives to its workers, then waits ``--shutdown-timeout`` seconds (30 by default)
before SIGKILL. The handler here only records the signal. Once per step every rank offers what it
received to an all-reduce (MAX), so all ranks agree on the step to stop at; the Trainer then
writes a checkpoint and ``train.py`` exits with ``REQUEUE_EXIT_CODE``. Restarting the same
command (``resume=auto``, the default) continues from that checkpoint exactly.

Cost: one all-reduce of a 4-byte CPU tensor per step, issued without waiting and read one step
later (so a stop lands one or two steps after the signal). It runs over gloo on the host: a GPU
run (NCCL) gets a separate gloo group for it, so the check never synchronises the device.
"""

from __future__ import annotations

import logging
import signal
from types import FrameType

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

# "Stopped early on request; run the same command again." 124 is what timeout(1) returns when its
# time ran out. torchrun itself exits 1 when it is signalled, whatever its workers return, so a
# Slurm script that launches through torchrun decides on requeueing by itself (docs/failures.md).
REQUEUE_EXIT_CODE = 124
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

_HOST_GROUP: list = []  # the gloo group of a NCCL run, made once per process


class Preempted(SystemExit):
    """Raised by ``train.train`` after the checkpoint of a stop on a signal was written; as a
    SystemExit it ends the process with ``REQUEUE_EXIT_CODE`` (Hydra passes it through)."""

    def __init__(self, signame: str, step: int, out_dir: str, command: str = "") -> None:
        super().__init__(REQUEUE_EXIT_CODE)
        self.signame, self.step, self.out_dir, self.command = signame, step, out_dir, command

    def __str__(self) -> str:
        again = f": {self.command}" if self.command else ""
        return (
            f"stopped on {self.signame} at step {self.step}, checkpoint written in "
            f"{self.out_dir}; to continue, run the same command again{again}; exit status "
            f"{REQUEUE_EXIT_CODE} means 'requeue me'"
        )


def _host_group():
    """The group the stop flag travels in: the default one when it is gloo, else a gloo one."""
    if dist.get_backend() == "gloo":
        return None
    if not _HOST_GROUP:
        _HOST_GROUP.append(dist.new_group(backend="gloo"))
    return _HOST_GROUP[0]


class PreemptionGuard:
    """Context manager around the training loop: installs the handlers, restores the old ones.

    ``stop_requested()`` is a collective: every rank calls it once per step, in the same order."""

    def __init__(self, signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> None:
        self.signals = signals
        self.received: int = 0  # the signal number, 0 while none came
        self.agreed: int = 0
        self._previous: dict[int, object] = {}
        self._flag = torch.zeros(1, dtype=torch.int32)
        self._work = None
        self._distributed = dist.is_available() and dist.is_initialized()
        self._group = _host_group() if self._distributed else None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum  # only a flag: the loop decides at the end of its step

    def __enter__(self) -> PreemptionGuard:
        for sig in self.signals:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: signals keep their default action
                log.warning("not in the main thread: %s will not stop the run cleanly", sig.name)
        return self

    def __exit__(self, *exc_info) -> None:
        if self._work is not None and exc_info[0] is None:
            self._work.wait()  # every rank issued it: finish it before the group is used again
        self._work = None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    @property
    def signame(self) -> str:
        return signal.Signals(self.agreed).name if self.agreed else ""

    def stop_requested(self) -> bool:
        """Whether every rank should stop after this step: some rank got a stop signal."""
        if not self._distributed:
            self.agreed = self.received
            return bool(self.agreed)
        if self._work is not None:  # last step's all-reduce, long done: no waiting in practice
            self._work.wait()
            self._work = None
            self.agreed = int(self._flag.item())  # a CPU tensor: no device synchronisation
            if self.agreed:
                return True
        self._flag.fill_(self.received)
        self._work = dist.all_reduce(
            self._flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True
        )
        return False
