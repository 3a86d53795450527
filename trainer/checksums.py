"""Checksums of checkpoints: written with every checkpoint, checked before one is trained on.

A flipped bit in a weight or an Adam moment parses as well as the original: without a hash a
damaged checkpoint resumes silently on other numbers. Every checkpoint therefore carries the
SHA-256 of each of its files, in ``sha256sum``'s format (``sha256sum -c`` checks one by hand):

- a file checkpoint ``step_N.pt`` has ``step_N.pt.sha256`` beside it, hashed from the bytes as
  ``torch.save`` writes them (no second read) and written before the checkpoint's own rename, so
  a checkpoint never appears without its checksum (a kill in between leaves a checksum alone,
  which the next save removes);
- a DCP directory ``step_N/`` holds ``checksums.sha256`` with one line per file, written by rank
  0 into the ``.partial`` directory before the rename that commits it; the asynchronous save
  hashes in its writer thread, off the training step (hashlib releases the GIL).

``verify`` checks a checkpoint: a mismatch, or a listed file missing, is a ``ChecksumMismatch``
(a ValueError: resume=auto falls back to the previous checkpoint, resume=PATH refuses) in one
line naming the file. A checkpoint written before checksums existed loads with a one-line note.
``python -m scripts.checksum_cost`` measures what hashing costs.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from runtime.files import atomic_open

log = logging.getLogger(__name__)

SUFFIX = ".sha256"  # beside a file checkpoint: step_N.pt.sha256
MANIFEST = "checksums.sha256"  # inside a DCP checkpoint directory
_CHUNK = 8 << 20
_noted: set[Path] = set()  # checkpoints already noted as carrying no checksum (once each)


class ChecksumMismatch(ValueError):
    """A checkpoint file whose bytes are not those that were written."""


class HashingWriter:
    """A binary file that hashes what is written through it (``torch.save`` writes in order)."""

    def __init__(self, f: Any) -> None:
        self.f, self.hash = f, hashlib.sha256()

    def write(self, data: Any) -> int:
        self.hash.update(data)
        return self.f.write(data)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, ...
        return getattr(self.f, name)


def sidecar(path: Path) -> Path:
    return path.with_name(path.name + SUFFIX)


def _line(digest: str, name: str) -> str:
    return f"{digest}  {name}\n"


def save_checksummed(obj: Any, path: str | Path) -> str:
    """``torch.save(obj)`` to ``path`` atomically with its checksum beside it; returns the digest.
    The checksum is in place before the checkpoint's rename (``atomic_open`` renames on exit)."""
    path = Path(path)
    with atomic_open(path, "wb") as f:
        writer = HashingWriter(f)
        torch.save(obj, writer)
        digest = writer.hash.hexdigest()
        with atomic_open(sidecar(path), "w") as side:
            side.write(_line(digest, path.name))
    return digest


def file_digest(path: Path) -> str:
    """The SHA-256 of a file, read in 8 MiB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(directory: Path) -> None:
    """``checksums.sha256`` in ``directory``: one line per file in it (DCP's files and the side
    file), written atomically."""
    names = sorted(p.name for p in directory.iterdir() if p.is_file() and p.name != MANIFEST)
    lines = "".join(_line(file_digest(directory / n), n) for n in names)
    with atomic_open(directory / MANIFEST, "w") as f:
        f.write(lines)


def _parse(text: str, source: Path) -> dict[str, str]:
    """``{name: digest}`` of a ``sha256sum`` listing; ChecksumMismatch when it is not one."""
    out = {}
    for line in text.splitlines():
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64 or not name or "/" in name:
            raise ChecksumMismatch(f"{source} is not a checksum list (line {line[:60]!r}); "
                                   "the checkpoint cannot be verified: pick another")  # fmt: skip
        out[name.lstrip("*")] = digest.lower()
    return out


def _check(directory: Path, listed: dict[str, str], names: Iterable[str]) -> None:
    for name in names:
        if name not in listed:
            raise ChecksumMismatch(f"{directory / name} has no checksum in its checkpoint's list "
                                   "(added after it was written): pick another checkpoint")  # fmt: skip
        path = directory / name
        if not path.is_file():
            raise ChecksumMismatch(f"{path} is missing (its checkpoint lists it): pick another "
                                   "checkpoint")  # fmt: skip
        found = file_digest(path)
        if found != listed[name]:
            raise ChecksumMismatch(
                f"{path} fails its checksum (sha256 {found[:12]}..., written as "
                f"{listed[name][:12]}...): it changed after it was written (a damaged disk or "
                "copy); pick another checkpoint"
            )


def checksummed_siblings(path: Path) -> list[Path]:
    """The other checkpoints of ``path``'s folder (``step_*``) that carry a checksum."""
    out = []
    for other in sorted(path.parent.glob("step_*")):
        if other == path or other.name.endswith(SUFFIX) or other.name.startswith("."):
            continue
        listing = other / MANIFEST if other.is_dir() else sidecar(other)
        if listing.is_file():
            out.append(other)
    return out


def note_unverified(path: str | Path) -> None:
    """The one-line note for a checkpoint of a run that never had checksums, once it has been
    read (never before a refusal of the same checkpoint): it was loaded unverified."""
    path = Path(path)
    listing = path / MANIFEST if path.is_dir() else sidecar(path)
    if not listing.is_file() and path not in _noted:
        _noted.add(path)
        log.warning("%s carries no checksum (written before checkpoints had them): loaded "
                    "unverified", path)  # fmt: skip


def verify(path: str | Path, names: Iterable[str] | None = None) -> bool:
    """Check the checkpoint at ``path`` (a file, or a DCP directory: ``names`` limits which of
    its files, by default all it lists); ChecksumMismatch on any difference, and for a checkpoint
    without a checksum whose siblings have one (``checksummed_siblings``). Returns False for a
    checkpoint of a run written before checksums (its reader notes it once it has read it:
    ``note_unverified``)."""
    path = Path(path)
    listing = path / MANIFEST if path.is_dir() else sidecar(path)
    if not listing.is_file():
        others = checksummed_siblings(path)
        if others:  # its run writes checksums: this one's is gone, so it is not to be trusted
            raise ChecksumMismatch(
                f"{path} carries no checksum while {others[0].name} beside it does (its checksum "
                "was deleted, or the save did not finish): treated as damaged; resume=auto falls "
                "back to the previous checkpoint, or pick another"
            )
        return False
    listed = _parse(listing.read_text(encoding="utf-8", errors="replace"), listing)
    if path.is_dir():
        present = {p.name for p in path.iterdir() if p.is_file() and p.name != MANIFEST}
        extra = sorted(present - set(listed))
        if extra:  # a file put there later: a planted index, a stray shard
            raise ChecksumMismatch(f"{path / extra[0]} is not in its checkpoint's checksum list "
                                   "(added after it was written): pick another checkpoint")  # fmt: skip
        _check(path, listed, listed if names is None else names)
    else:  # one line; its name may differ when the pair was copied under another name
        _check(path.parent, {path.name: next(iter(listed.values()), "")}, [path.name])
    return True
