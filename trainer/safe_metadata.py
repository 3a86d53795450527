"""DCP's ``.metadata`` index read without running code.

torch writes a DCP checkpoint's index with ``pickle.dump`` and its ``FileSystemReader`` reads it
back with a plain ``pickle.load``: a planted ``.metadata`` would run any command the moment a
checkpoint directory is opened (eval.py, resume, conversion, export, sampling). Here the index is
read by an unpickler that admits only the classes such an index holds, as ``weights_only`` does
for tensor files, and refuses anything else with one line before any other work.

The allow-list (found by recording what torch 2.5-2.13 write for plain, DDP-shared and FSDP
DTensor state dicts): DCP's metadata dataclasses, its file-system storage record, ``torch.Size``,
dtypes, the layout helper and memory-format enum that ``TensorProperties`` pickles through, and
the path class DCP records its checkpoint id with.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

_DCP_META = "torch.distributed.checkpoint.metadata"
ALLOWED: dict[str, frozenset[str]] = {
    _DCP_META: frozenset(
        {
            "Metadata",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "TensorProperties",
            "ChunkStorageMetadata",
            "MetadataIndex",
            "StorageMeta",
            "_MEM_FORMAT_ENCODING",
        }
    ),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.serialization": frozenset({"_get_layout"}),  # a name -> torch.layout lookup
    "torch": frozenset({"Size"}),  # and the dtypes: _is_dtype
    "pathlib": frozenset({"Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"}),
    "collections": frozenset({"OrderedDict"}),
}


class UnsafeMetadata(ValueError):
    """A ``.metadata`` that names something outside the allow-list (or is no DCP index)."""


# The most nodes (containers and values) a loader walks in a checkpoint's structure, and its
# deepest nesting: this code's largest checkpoints hold a few thousand; a crafted file whose
# shared references make a small pickle a tree of 2^60 leaves stops here, in well under a second.
NODE_BUDGET = 2_000_000
MAX_DEPTH = 100


def bounded(obj: Any, source: str | Path, budget: int = NODE_BUDGET) -> Any:
    """``obj`` if walking it as the loaders do (every dict, list and tuple, a shared one once
    for each place it is reached) stays within ``budget`` nodes and ``MAX_DEPTH`` levels; else
    UnsafeMetadata, a one-line refusal. Each container's size is computed once (memoised by
    identity), so a crafted DAG of 2^60 leaves is refused after a few dozen steps, not walked."""
    sizes: dict[int, int] = {}
    stack: list[tuple[Any, int, bool]] = [(obj, 0, False)]

    def refuse(what: str) -> UnsafeMetadata:
        return UnsafeMetadata(
            f"{source} was refused: its structure is {what} (a crafted file: shared references "
            "that make a small file an endless walk); delete that checkpoint or pick another"
        )

    while stack:
        node, depth, expanded = stack.pop()
        if id(node) in sizes:
            continue
        if depth > MAX_DEPTH:
            raise refuse(f"deeper than {MAX_DEPTH} levels")
        items = list(node.values()) if isinstance(node, dict) else node
        kids = [v for v in items if isinstance(v, (dict, list, tuple))]
        if not expanded:
            stack.append((node, depth, True))
            stack.extend((v, depth + 1, False) for v in kids if id(v) not in sizes)
            continue
        total = 1 + len(items) * (2 if isinstance(node, dict) else 1)
        total += sum(sizes.get(id(v), 0) for v in kids)
        if total > budget:
            raise refuse(f"more than {budget:,} nodes")
        sizes[id(node)] = total
    return obj


def check_storage(meta: Metadata, directory: Path, listed: set[str] | None) -> None:
    """Every file the index ``meta`` points at: a plain name (no folder, no ``..``, not absolute)
    of a regular file inside ``directory`` (not a FIFO, a link or a device) and, where the
    checkpoint has a checksum list, one it lists; else UnsafeMetadata in one line. Nothing
    outside the checkpoint is ever opened."""
    import os
    import stat

    names = set()
    for info in (getattr(meta, "storage_data", None) or {}).values():
        name = getattr(info, "relative_path", None)
        if (
            not isinstance(name, str)
            or not name
            or name in (".", "..")
            or "/" in name
            or "\\" in name
            or "\0" in name
        ):
            raise UnsafeMetadata(
                f"{directory}: its index points at {str(name)[:80]!r}, which is not a plain file "
                "name inside the checkpoint (a crafted index): delete that checkpoint or pick "
                "another"
            )
        names.add(name)
    for name in sorted(names):
        try:
            mode = os.lstat(directory / name).st_mode
        except OSError:
            raise UnsafeMetadata(
                f"{directory / name} is missing (its index points at it): the checkpoint is "
                "incomplete; pick another"
            ) from None
        if not stat.S_ISREG(mode):
            raise UnsafeMetadata(
                f"{directory / name} is not a regular file (a link, FIFO or device: a crafted "
                "checkpoint); delete that checkpoint or pick another"
            )
        if listed is not None and name not in listed:
            raise UnsafeMetadata(
                f"{directory / name} is not in its checkpoint's checksum list: delete that "
                "checkpoint or pick another"
            )


def _is_dtype(module: str, name: str) -> bool:
    return module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)


class _AllowListUnpickler(pickle.Unpickler):
    """An unpickler whose ``find_class`` admits only ``ALLOWED`` (and torch's dtypes)."""

    def find_class(self, module: str, name: str) -> Any:
        if name in ALLOWED.get(module, ()) or _is_dtype(module, name):
            return super().find_class(module, name)
        raise UnsafeMetadata(f"it names {module}.{name}, which a DCP index never holds")

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeMetadata("it holds a persistent reference, which a DCP index never holds")


def read_metadata(path: str | Path) -> Metadata:
    """The DCP index at ``path`` (a ``.metadata`` file), read by the allow-list unpickler;
    ``UnsafeMetadata`` (a ValueError) with a one-line reason when it is anything else."""
    path = Path(path)
    data = path.read_bytes()
    try:
        meta = _AllowListUnpickler(io.BytesIO(data)).load()
    except UnsafeMetadata as exc:
        raise UnsafeMetadata(
            f"{path} was refused unread: {exc} (a planted or foreign file; nothing in it was "
            "run); delete that checkpoint or pick another"
        ) from None
    except Exception as exc:  # cut short, not a pickle: the ordinary unreadable case
        raise UnsafeMetadata(f"{path} is not a DCP index ({type(exc).__name__}: {exc})") from None
    if not isinstance(meta, Metadata):
        raise UnsafeMetadata(f"{path} is not a DCP index (it holds a {type(meta).__name__})")
    return meta


def _listed(directory: Path) -> set[str] | None:
    """The names a DCP checkpoint's checksum list holds (None: it has none)."""
    from trainer.checksums import MANIFEST

    listing = directory / MANIFEST
    if not listing.is_file():
        return None
    text = listing.read_text(encoding="utf-8", errors="replace")
    return {line.partition("  ")[2].lstrip("*") for line in text.splitlines()}


class SafeFileSystemReader(dcp.FileSystemReader):
    """torch's ``FileSystemReader`` with its ``read_metadata`` (a plain ``pickle.load``) replaced
    by ``read_metadata`` above; ``dcp.load`` reads the index through it too."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")  # torch 2.13 may write one index per rank: __<rank>.metadata
        meta = read_metadata(
            Path(self.path) / (".metadata" if rank is None else f"__{rank}.metadata")
        )
        check_storage(meta, Path(self.path), _listed(Path(self.path)))
        if getattr(meta, "storage_meta", None) is None:
            meta.storage_meta = StorageMeta()  # as torch's reader does
        meta.storage_meta.load_id = self.load_id
        return meta
