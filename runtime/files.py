"""Atomic file writes: a file appears under its final name whole, or not at all.

Imports only the standard library, so every part (data/ included, which imports nothing else
of runtime/) can use it.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


def current_umask() -> int:
    """The process's umask, read without changing it where Linux allows (threads may be
    creating files meanwhile), else set and restored at once."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def atomic_open(path: str | Path, mode: str = "wb") -> Iterator[IO]:
    """Open a temporary file beside ``path``; on success fsync it and rename it to ``path``.

    A crash or an exception never leaves a half-written file under the final name (a kill may
    leave the temporary ``.<name>.*.tmp``, which readers ignore); the file gets the permissions
    that ``open()`` would give it (0o666 less the umask)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp makes 0600: give what open() gives
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# Why storage refuses a write, in words a user acts on (the rest: the system's own words)
_STORAGE = {
    errno.EROFS: "is on read-only storage",
    errno.EACCES: "is not writable here (permission denied)",
    errno.EPERM: "is not writable here (operation not permitted)",
    errno.ENOSPC: "is on a full disk (no space left on device)",
    errno.EDQUOT: "is over its disk quota",
}


def storage_problem(path: str | Path, exc: OSError) -> str:
    """``path`` and why its storage refused a write, in one phrase: ``runs/x is on read-only
    storage``; the system's words where the errno is not one of a storage's refusals."""
    what = _STORAGE.get(exc.errno) if exc.errno is not None else None
    return f"{path} {what}" if what else f"cannot write to {path}: {exc.strerror or exc}"


def check_writable(path: str | Path) -> None:
    """Raise the storage's OSError where a file cannot be created at ``path`` (a read-only
    mount, no permission, a full disk): a temporary file is created and removed in the nearest
    directory of ``path`` that exists, so nothing is left behind and no directory is made. As
    root, where permissions do not stop a write, only the write itself can tell."""
    directory = Path(path).parent
    while not directory.is_dir() and directory != directory.parent:
        directory = directory.parent
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".write-check.", suffix=".tmp")
    os.close(fd)
    os.unlink(tmp)
