"""Stop cleanly when the cluster or the user says so: SIGTERM, SIGUSR1 or SIGINT (Ctrl-C) ends
the run at a step boundary, with a checkpoint.

Slurm sends SIGTERM before it kills a job (at its time limit, on preemption, on ``scancel``),
and SIGUSR1 ahead of time when asked (``#SBATCH --signal=USR1@120``); torchrun's agent forwards
the signal it receives to its workers, then waits ``--shutdown-timeout`` seconds (30 by default)
before SIGKILL. The handler here only records the signal. Once per step every rank offers what it
received to an all-reduce (MAX), so all ranks agree on the step to stop at; the Trainer then
writes a checkpoint and ``train.py`` exits with ``REQUEUE_EXIT_CODE``. Restarting the same
command (``resume=auto``, the default) continues from that checkpoint exactly.

Ctrl-C (SIGINT) is a stop like SIGTERM: one line says the run stops after this step, the
checkpoint is written, and the process exits with 130 (the shell's code for Ctrl-C, which a
requeue script should not requeue) saying how to continue. A second Ctrl-C exits at once, without
a checkpoint (the last one written stays valid: checkpoints are written atomically). Under
torchrun each worker gets the terminal's SIGINT and the one torchrun forwards a moment later, so
a second SIGINT within ``DOUBLE_PRESS_S`` of the first counts as the same press.

Cost: one all-reduce of a 4-byte CPU tensor per step, issued without waiting and read one step
later (so a stop lands one or two steps after the signal). It runs over gloo on the host: a GPU
run (NCCL) gets a separate gloo group for it, so the check never synchronises the device.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import sys
import time
from types import FrameType

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

# "Stopped early on request; run the same command again." 124 is what timeout(1) returns when its
# time ran out. torchrun itself exits 1 when it is signalled, whatever its workers return, so a
# Slurm script that launches through torchrun decides on requeueing by itself (docs/failures.md).
REQUEUE_EXIT_CODE = 124
INTERRUPT_EXIT_CODE = 130  # 128 + SIGINT: what a shell reports for a Ctrl-C
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
DOUBLE_PRESS_S = 1.0  # a SIGINT this soon after the first is torchrun's copy of the same press

_HOST_GROUP: list = []  # the gloo group of a NCCL run, made once per process


class Preempted(SystemExit):
    """Raised by ``train.train`` after the checkpoint of a stop on a signal was written; as a
    SystemExit it ends the process with ``REQUEUE_EXIT_CODE`` (Hydra passes it through)."""

    def __init__(self, signame: str, step: int, out_dir: str, command: str = "") -> None:
        interrupted = signame == "SIGINT"
        super().__init__(INTERRUPT_EXIT_CODE if interrupted else REQUEUE_EXIT_CODE)
        self.signame, self.step, self.out_dir, self.command = signame, step, out_dir, command

    def __str__(self) -> str:
        again = f": {self.command}" if self.command else ""
        status = ("" if self.code == INTERRUPT_EXIT_CODE
                  else f"; exit status {REQUEUE_EXIT_CODE} means 'requeue me'")  # fmt: skip
        return (
            f"stopped on {self.signame} at step {self.step}, checkpoint written in "
            f"{self.out_dir}; to continue, run the same command again{again}{status}"
        )


def resume_command() -> str:
    """The command that continues this run: the one that started it (its directory's name
    depends only on it), secrets redacted."""
    from trainer.checks import redact

    launcher = "torchrun ... " if os.environ.get("TORCHELASTIC_RUN_ID") else "python "
    return launcher + shlex.join(redact([os.path.basename(sys.argv[0]), *sys.argv[1:]]))


def _host_group():
    """The group the stop flag travels in: the default one when it is gloo, else a gloo one."""
    if dist.get_backend() == "gloo":
        return None
    if not _HOST_GROUP:
        _HOST_GROUP.append(dist.new_group(backend="gloo"))
    return _HOST_GROUP[0]


def _say(line: str) -> None:
    """One line on stderr from rank 0, written directly: safe inside a signal handler."""
    if os.environ.get("RANK", "0") == "0":
        os.write(2, (line + "\n").encode())


class PreemptionGuard:
    """Context manager around the training loop: installs the handlers, restores the old ones.

    ``stop_requested()`` is a collective: every rank calls it once per step, in the same order."""

    def __init__(self, signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> None:
        self.signals = signals
        self.received: int = 0  # the signal number, 0 while none came
        self.agreed: int = 0
        self._previous: dict[int, object] = {}
        self._interrupted_at: float | None = None  # when the first Ctrl-C came
        self._flag = torch.zeros(1, dtype=torch.int32)
        self._work = None
        self._distributed = dist.is_available() and dist.is_initialized()
        self._group = _host_group() if self._distributed else None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT:
            now = time.monotonic()
            if self._interrupted_at is None:
                self._interrupted_at = now
                _say("Ctrl-C: stopping after this step and writing a checkpoint "
                     "(Ctrl-C again to exit at once, without one)")  # fmt: skip
            elif now - self._interrupted_at >= DOUBLE_PRESS_S:
                _say("second Ctrl-C: exiting now, without a checkpoint; the last one written "
                     "is intact: run the same command again to continue from it")  # fmt: skip
                os._exit(INTERRUPT_EXIT_CODE)  # at once: no step, no save, no clean-up to wait on
        if not self.received:  # the first stop signal names the stop
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
