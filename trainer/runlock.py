"""One process per run directory: an advisory lock taken before anything is written.

Two trainings in one ``out_dir`` delete each other's temporary files as leftovers and write over
each other's checkpoints. Rank 0 of a job therefore holds an exclusive ``fcntl.flock`` on the
directory itself (non-blocking) from before its first write until the run ends; under torchrun
the other ranks of the same job write only what rank 0 allows and take no lock. While it holds
the lock it keeps ``<out_dir>/.lock``: its host, process id and start time, which a refused
process names in one line; the file goes on release, so a finished run started again changes no
file of its directory.

A lock cannot go stale: the kernel releases it when its holder dies (``kill -9`` included), and
the next run takes it over, saying whose it was. Where the filesystem has no working ``flock``
(some NFS mounts answer ENOLCK or EOPNOTSUPP), an exclusive marker file ``.lock.marker`` is
created instead (``O_CREAT | O_EXCL``) and removed on release; a marker whose holder is gone
(same host, no such process) is stale and replaced, and one from another host is named with the
command that removes it.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import logging
import os
import platform
from pathlib import Path

from runtime.files import atomic_open, storage_problem

log = logging.getLogger(__name__)

LOCK = ".lock"
MARKER = ".lock.marker"
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.EBADF}


class RunDirBusy(SystemExit):
    """Another live process holds the run directory: one line naming it and what to do."""


class RunDirUnwritable(SystemExit):
    """The run directory's storage refuses writes (a read-only mount, no permission, a full
    disk): one line naming it and what to do, before anything of the run is written."""

    def __init__(self, out_dir: Path, exc: OSError) -> None:
        super().__init__(
            f"{storage_problem(out_dir, exc)}: a run writes its lock, logs and checkpoints there, "
            "so it cannot start or go on in it; nothing was written. Copy the run to writable "
            "storage and give out_dir=COPY (a finished run's results need no training: python "
            "eval.py checkpoint=DIR out=FILE reads it where it is)"
        )


def _holder() -> dict:
    return {"host": platform.node(), "pid": os.getpid(),
            "since": datetime.datetime.now().isoformat(timespec="seconds")}  # fmt: skip


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _busy(out_dir: Path, holder: dict, how: str) -> RunDirBusy:
    who = f"process {holder.get('pid', '?')} on host {holder.get('host', '?')}"
    since = f" since {holder['since']}" if holder.get("since") else ""
    return RunDirBusy(
        f"{out_dir} is in use by {who}{since} ({how}): one process per run directory. Wait for "
        "it to end (or stop it), or give this run another name=NAME or out_dir=DIR"
    )


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


class RunLock:
    """The lock of one run directory, held from ``acquire`` to ``release`` (or process exit)."""

    def __init__(self, out_dir: str | Path) -> None:
        self.out_dir = Path(out_dir)
        self.fd: int | None = None
        self.marker: Path | None = None
        self.created = False  # the directory was made for this run: removed again if left empty

    def acquire(self) -> RunLock:
        """Take the lock (creating ``out_dir``); RunDirBusy when a live process holds it."""
        self.created = not self.out_dir.exists()
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a read-only mount, no permission: one line, nothing written
            self.created = False
            raise RunDirUnwritable(self.out_dir, exc) from None
        info = self.out_dir / LOCK
        fd = os.open(self.out_dir, os.O_RDONLY)  # the directory itself: no file of it changes
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise _busy(self.out_dir, _read(info), "it holds the directory's lock") from None
            if exc.errno in _NO_LOCKS:
                return self._acquire_marker(exc)
            raise
        previous = _read(info)  # left only by a holder that died: the kernel freed its lock
        if previous.get("pid"):
            log.info("%s: took over the lock of process %s on %s, which is gone", self.out_dir,
                     previous.get("pid"), previous.get("host"))  # fmt: skip
        self.fd = fd
        try:
            with atomic_open(info, "w") as f:  # who holds it, for the refusal of another
                f.write(json.dumps(_holder()))
        except OSError as exc:  # the directory's first write: its storage refuses it
            self.release()
            raise RunDirUnwritable(self.out_dir, exc) from None
        except BaseException:
            self.release()
            raise
        return self

    def _acquire_marker(self, why: OSError) -> RunLock:
        """The fallback where flock does not work: an exclusive marker file."""
        marker = self.out_dir / MARKER
        log.warning("%s: no working file locks here (%s): using the marker file %s instead",
                    self.out_dir, why.strerror or why, marker)  # fmt: skip
        for _ in range(2):  # a second try after a stale marker is removed
            try:
                fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                holder = _read(marker)
                if holder.get("host") == platform.node() and not _alive(holder.get("pid")):
                    log.info("%s: removing the stale marker of process %s, which is gone",
                             self.out_dir, holder.get("pid"))  # fmt: skip
                    marker.unlink(missing_ok=True)
                    continue
                raise _busy(self.out_dir, holder, f"its marker {marker}; if that process is "
                            f"gone, delete the marker: rm {marker}") from None  # fmt: skip
            except OSError as exc:  # a read-only mount, no permission
                raise RunDirUnwritable(self.out_dir, exc) from None
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(_holder()))
            self.marker = marker
            return self
        raise _busy(self.out_dir, _read(marker), f"its marker {marker}")

    def release(self) -> None:
        """Let the directory go (idempotent), removing the holder file or the marker."""
        if self.fd is not None:
            # before the unlock: never another's; where the storage refuses (read-only), a file
            # left behind names a holder that is gone, whose lock the next run takes over
            with contextlib.suppress(OSError):
                (self.out_dir / LOCK).unlink(missing_ok=True)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
        if self.marker is not None:
            with contextlib.suppress(OSError):
                self.marker.unlink(missing_ok=True)
            self.marker = None
        if self.created:  # a run refused before its first file leaves no directory behind
            self.created = False
            with contextlib.suppress(OSError):  # not empty: the run's files stay
                self.out_dir.rmdir()

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
