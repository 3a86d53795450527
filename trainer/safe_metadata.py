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


class SafeFileSystemReader(dcp.FileSystemReader):
    """torch's ``FileSystemReader`` with its ``read_metadata`` (a plain ``pickle.load``) replaced
    by ``read_metadata`` above; ``dcp.load`` reads the index through it too."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")  # torch 2.13 may write one index per rank: __<rank>.metadata
        meta = read_metadata(
            Path(self.path) / (".metadata" if rank is None else f"__{rank}.metadata")
        )
        if getattr(meta, "storage_meta", None) is None:
            meta.storage_meta = StorageMeta()  # as torch's reader does
        meta.storage_meta.load_id = self.load_id
        return meta
