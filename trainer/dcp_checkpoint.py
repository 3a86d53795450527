"""Checkpoints through ``torch.distributed.checkpoint`` (DCP): sharded, optionally asynchronous.

A DCP checkpoint is the directory ``<out_dir>/checkpoints/step_<N>/`` holding

- DCP's files: every tensor of the model and optimizer state (``__<rank>_0.distcp`` per rank and
  the ``.metadata`` index). With DDP every rank holds the same tensors; each rank hands DCP only
  its share of them (``my_share``: balanced by bytes), so N ranks write, and for an asynchronous
  save copy to CPU, about 1/N each. With FSDP (``parallel=fsdp``) the model and optimizer tensors
  are DTensors: each rank writes its own shards, and the index records where each shard lies in
  the full tensor, so the same keys read back whole (``load_dcp``) on any number of processes.
- ``train_state.pt``: everything else, written by rank 0 (``torch.save``, loaded with
  ``weights_only=True``): the step, counters, config, loader position, every rank's RNG state,
  and the *skeleton* of the model and optimizer state dicts (their structure, non-tensor values
  such as param groups and int keys, and for each tensor the DCP key it is stored under).

Written under ``.step_<N>.partial/``, renamed to ``step_<N>/`` by rank 0 once every rank has
written its share: a kill mid-write leaves no directory that resume picks (``list_checkpoints``).

With ``async_checkpoint=true`` the tensors are copied to CPU memory (the only stall of the loop),
then written and committed by a background thread while training continues; the next save and
the end of the run wait for it. Loading needs no process group: every rank reads the whole
(replicated) state, so a checkpoint loads on any number of processes, like the file format.
"""

from __future__ import annotations

import errno
import inspect
import logging
import os
import pickle
import shutil
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.tensor import DTensor

from runtime.files import atomic_open
from trainer.checksums import note_unverified, verify, write_manifest
from trainer.safe_metadata import SafeFileSystemReader, bounded, check_storage, read_metadata

log = logging.getLogger(__name__)

TRAIN_STATE = "train_state.pt"
METADATA = ".metadata"  # DCP's index, written last by its coordinator
_TENSOR = "__dcp_tensor__:"  # a skeleton leaf: the tensor stored in DCP under the key that follows
# One process without a process group is our ordinary case (and every load), not a surprise.
warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)


def is_dcp_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a complete DCP checkpoint directory."""
    path = Path(path)
    return (path / METADATA).is_file() and (path / TRAIN_STATE).is_file()


def split_tensors(obj: Any, prefix: str, out: dict[str, torch.Tensor]) -> Any:
    """``obj`` with every tensor replaced by a ``_TENSOR`` key string; the tensors go to ``out``
    under that key (the path of dict keys and list indices, joined by ``/``)."""
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj
        return _TENSOR + prefix
    if isinstance(obj, dict):
        return {k: split_tensors(v, f"{prefix}/{k}", out) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [split_tensors(v, f"{prefix}/{i}", out) for i, v in enumerate(obj)]
        return type(obj)(items)
    return obj


def join_tensors(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The inverse of ``split_tensors``."""
    if isinstance(obj, str) and obj.startswith(_TENSOR):
        return tensors[obj.removeprefix(_TENSOR)]
    if isinstance(obj, dict):
        return {k: join_tensors(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(join_tensors(v, tensors) for v in obj)
    return obj


def step_dir(checkpoints: Path, step: int) -> Path:
    return checkpoints / f"step_{step:07d}"


def _partial_dir(final: Path) -> Path:
    return final.with_name(f".{final.name}.partial")


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def my_share(tensors: dict[str, torch.Tensor], rank: int, world_size: int) -> list[str]:
    """The keys rank ``rank`` writes: the tensors dealt largest first to the rank with the
    fewest bytes so far. Every rank computes the same split (the state is replicated)."""
    load, mine = [0] * world_size, []
    for key in sorted(tensors, key=lambda k: (-tensors[k].nbytes, k)):
        r = min(range(world_size), key=load.__getitem__)
        load[r] += tensors[key].nbytes
        if r == rank:
            mine.append(key)
    return mine


def stage_buffers(
    tensors: dict[str, torch.Tensor],
) -> tuple[dict[torch.dtype, torch.Tensor], dict[str, torch.Tensor]]:
    """One flat CPU buffer per dtype, sized to hold every tensor of that dtype (pinned when any
    of them is on a GPU: pinning is CUDA's), and each tensor's view of its buffer."""
    sizes: dict[torch.dtype, int] = {}
    pin: dict[torch.dtype, bool] = {}
    for t in tensors.values():
        sizes[t.dtype] = sizes.get(t.dtype, 0) + t.numel()
        pin[t.dtype] = pin.get(t.dtype, False) or t.is_cuda
    flat = {d: torch.empty(n, dtype=d, pin_memory=pin[d]) for d, n in sizes.items()}
    views, offset = {}, dict.fromkeys(sizes, 0)
    for k, t in tensors.items():
        start = offset[t.dtype]
        views[k] = flat[t.dtype][start : start + t.numel()].view(t.shape)
        offset[t.dtype] = start + t.numel()
    return flat, views


def as_shard(buffer: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``buffer`` (the CPU copy of ``like``'s local block) as a DTensor laid out as the DTensor
    ``like`` (its mesh, placements, global shape); ``buffer`` itself when ``like`` is plain.
    Not ``DTensor.from_local``, which would move the copy back to the mesh's device (a GPU)."""
    if not isinstance(like, DTensor):
        return buffer
    return DTensor(buffer, like._spec, requires_grad=False)


class _Prestaged(AsyncStager):
    """For ``async_save``: the state dict is already a private CPU copy (``DcpCheckpointer``)."""

    _synchronize_after_execute = False

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        return state_dict


def async_save_fallback() -> str:
    """Why ``dcp.async_save`` cannot take our call on this torch ("" when it can): it needs
    ``async_stager`` (our buffers are already a private CPU copy) and ``no_dist`` (one process
    without a process group), which torch 2.7 and older lack. The fallback writes with
    ``dcp.save`` in the saver's own background thread: the same files, the same stall."""
    try:
        params = inspect.signature(dcp.async_save).parameters
    except (TypeError, ValueError):  # a wrapped builtin: take it as lacking everything
        params = {}
    missing = [name for name in ("async_stager", "no_dist") if name not in params]
    if not missing:
        return ""
    return (
        f"torch {torch.__version__}'s dcp.async_save takes no {' or '.join(missing)}: "
        "writing with dcp.save in a background thread instead"
    )


class DcpCheckpointer:
    """Writes DCP checkpoints; at most one asynchronous save is in flight at a time.

    Every rank calls ``save`` with the same step (it holds collectives) and writes its share
    (``my_share``); rank 0 also writes the side file and commits. An asynchronous save first
    copies this rank's share into CPU buffers kept from one save to the next (pinned for GPU
    tensors): that copy is the loop's only stall. ``last_stall_s``: how long ``save`` blocked."""

    def __init__(self, *, asynchronous: bool, rank: int = 0, world_size: int = 1) -> None:
        self.asynchronous, self.rank, self.world_size = asynchronous, rank, world_size
        self.is_main = rank == 0
        self.distributed = tdist.is_available() and tdist.is_initialized()
        # DCP's collectives run on a gloo group of their own: an asynchronous save runs them in
        # a background thread while DDP uses the default group (NCCL on GPUs), and async_save
        # needs a CPU backend. Creating a group is a collective, so every rank does it here.
        self.group = tdist.new_group(backend="gloo") if self.distributed else None
        self.pending: Future | None = None
        self.pending_dir = Path()  # the checkpoint the pending save writes
        self.writer = ThreadPoolExecutor(max_workers=1) if asynchronous else None  # one thread
        self.buffers: dict[str, torch.Tensor] = {}  # views of ``flat``, one per tensor
        self.flat: dict[torch.dtype, torch.Tensor] = {}
        self.layout: list = []  # (key, shape, dtype, on a GPU) of the tensors staged last
        self.last_stall_s = 0.0
        self.fallback = async_save_fallback() if asynchronous else ""
        if self.fallback and self.is_main:
            log.warning("%s", self.fallback)

    def stage(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``tensors`` copied into this saver's CPU buffers: one flat buffer per dtype (pinned
        for GPU tensors), each tensor a view of it, kept from one save to the next and made again
        only when the shapes change. A DTensor (FSDP's shard) stages its local block and is
        handed to DCP as a DTensor of the same layout around the CPU copy (``as_shard``), as
        torch's own asynchronous save stages one. One pinned allocation per dtype, not one per tensor: the
        CUDA host allocator rounds each pinned block up (to a power of two), which cost about
        1.5x the state with a buffer per tensor."""
        shards = tensors
        tensors = {k: t.to_local() if isinstance(t, DTensor) else t for k, t in shards.items()}
        layout = [(k, t.shape, t.dtype, t.is_cuda) for k, t in tensors.items()]
        if layout != self.layout:
            self.layout = layout
            self.flat, self.buffers = stage_buffers(tensors)
            pinned = sum(b.nbytes for b in self.flat.values() if b.is_pinned())
            log.info("checkpoint staging: %s bytes in %d flat CPU buffer(s), %s of them pinned",
                     f"{self.staged_bytes:,}", len(self.flat), f"{pinned:,}")  # fmt: skip
        for k, t in tensors.items():
            self.buffers[k].copy_(t.detach(), non_blocking=t.is_cuda)
        if any(t.is_cuda for t in tensors.values()):
            torch.cuda.synchronize()
        return {k: as_shard(self.buffers[k], t) for k, t in shards.items()}

    @property
    def staged_bytes(self) -> int:
        """Bytes of the staging buffers (pinned where the state is on a GPU)."""
        return sum(b.nbytes for b in self.flat.values())

    def save(self, checkpoints: Path, step: int, states: dict[str, Any], side: dict[str, Any],
             commit: Callable[[Path], None]) -> Path:  # fmt: skip
        """Wait for the previous save, then write ``states`` (the model's and optimizer's state
        dicts by name) and ``side`` (rank 0's, picklable with ``weights_only``) as step ``step``;
        ``commit(final_dir)`` runs on rank 0 after the rename (to prune older checkpoints)."""
        t0 = time.perf_counter()
        self.wait()
        final = step_dir(checkpoints, step)
        partial = _partial_dir(final)
        tensors: dict[str, torch.Tensor] = {}
        skeleton = {name: split_tensors(sd, name, tensors) for name, sd in states.items()}
        # DTensors (FSDP's shards): every rank writes its own; replicated tensors: its share.
        plain = {k: t for k, t in tensors.items() if not isinstance(t, DTensor)}
        mine = set(my_share(plain, self.rank, self.world_size))
        tensors = {k: t for k, t in tensors.items() if k in mine or isinstance(t, DTensor)}
        if self.is_main:
            _remove(partial)  # a save killed earlier
            partial.mkdir(parents=True)
            with atomic_open(partial / TRAIN_STATE, "wb") as f:
                torch.save({**side, "skeleton": skeleton}, f)
        if self.distributed:
            tdist.barrier(group=self.group)  # the fresh directory exists before any rank writes
        kwargs = {"storage_writer": dcp.FileSystemWriter(partial), "process_group": self.group}
        kwargs["no_dist"] = not self.distributed
        if self.asynchronous:
            staged = self.stage(tensors)
            if self.fallback:  # an older torch: our own thread writes (async_save_fallback)
                upload = self.writer.submit(dcp.save, staged, **kwargs)
            else:
                upload = dcp.async_save(staged, async_stager=_Prestaged(), **kwargs)
            self.pending = self.writer.submit(self._finish, upload, partial, final, commit)
            self.pending_dir = final
        else:
            try:
                dcp.save(tensors, **kwargs)
                self._finish(None, partial, final, commit)
            except (Exception, CheckpointException) as exc:  # a full disk, on any rank
                raise write_error(final, exc) from None
        self.last_stall_s = time.perf_counter() - t0
        log.info("checkpoint step %d: the loop was blocked %.2f s", step, self.last_stall_s)
        return final

    def _finish(self, upload: Future | None, partial: Path, final: Path, commit) -> None:
        """Rank 0 writes the checksums and renames the directory into place; every rank returns
        only once it has (or raises its error): a finished save is a committed one on every rank,
        so a rank that names the newest checkpoint right after ``wait`` names this one."""
        if upload is not None:
            upload.result()  # every rank has written: DCP's coordinator wrote .metadata last
        failed = None
        if self.is_main:
            try:
                write_manifest(partial)  # the checksums, in this writer (a thread if asynchronous)
                if final.exists():  # the same step saved again (a relaunch): replaced
                    _remove(final)
                partial.rename(final)
                commit(final)
                log.info("saved %s", final)
            except Exception as exc:  # told to every rank below, then raised: no rank waits on
                failed = exc
        if self.distributed:  # rank 0 always reaches this broadcast, so no rank hangs on it
            told = [None if failed is None else write_failure(failed, final)]
            tdist.broadcast_object_list(told, src=0, group=self.group)
            if told[0] is not None and failed is None:
                raise OSError(f"rank 0 could not commit {final.name}: {told[0]}")
        if failed is not None:
            raise failed

    def wait(self) -> None:
        """Block until the save in flight (if any) is written and committed; re-raise its error."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            try:
                pending.result()
            except (Exception, CheckpointException) as exc:
                raise write_error(self.pending_dir, exc) from None

    def close(self) -> None:
        """Wait for the save in flight, then release the process group (a sweep makes many)."""
        self.wait()
        if self.writer is not None:
            self.writer.shutdown()
            self.writer = None
        if self.group is not None:
            tdist.destroy_process_group(self.group)
            self.group = None


def load_dcp(path: str | Path, *, parts: tuple[str, ...] = ("model", "optimizer")) -> dict:
    """A DCP checkpoint as the dict the single-file format holds (``trainer.checkpoint``), read
    on this process alone (no process group); ``parts`` limits which state dicts are read
    (``("model",)`` for evaluation skips the optimizer state)."""
    path = Path(path)
    if not is_dcp_checkpoint(path):
        raise ValueError(
            f"{path} is not a complete DCP checkpoint (it lacks {METADATA} or {TRAIN_STATE}: "
            "a save that did not finish?); pick another checkpoint"
        )
    verify(path, None if parts else (TRAIN_STATE, METADATA))  # before anything is parsed
    index = read_metadata(path / METADATA)  # a planted index is refused before anything else
    from trainer.safe_metadata import _listed

    check_storage(index, path, _listed(path))  # files inside it only, regular, listed
    try:
        side = torch.load(path / TRAIN_STATE, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated files, foreign data
        raise ValueError(
            f"{path} is not a readable DCP checkpoint ({short_reason(exc)}); pick another"
        ) from None
    bounded(side, path / TRAIN_STATE)  # a crafted skeleton: refused before any walk
    try:
        if not isinstance(side, dict) or not isinstance(side.get("skeleton"), dict):
            raise ValueError("no skeleton in it")
        skeleton = side.pop("skeleton")
        missing = [p for p in parts if p not in skeleton]
        if missing:
            raise ValueError(f"no {missing} state in it")
        reader = SafeFileSystemReader(path)  # never torch's plain pickle.load of the index
        meta = reader.read_metadata().state_dict_metadata
        tensors = {}  # the targets DCP reads into, shaped as its index says
        for key in {k for p in parts for k in _tensor_keys(skeleton[p])}:
            tensors[key] = torch.empty(meta[key].size, dtype=meta[key].properties.dtype)
        dcp.load(tensors, storage_reader=reader, no_dist=True)
    except (Exception, CheckpointException) as exc:  # truncated files, foreign data
        raise ValueError(
            f"{path} is not a readable DCP checkpoint ({short_reason(exc)}); pick another"
        ) from None
    for part in parts:
        side[part] = join_tensors(skeleton[part], tensors)
    if parts:  # read whole: noted only now, never before a refusal
        note_unverified(path)
    return side


def short_reason(exc: BaseException) -> str:
    """Why a checkpoint file could not be read, in one line: the loader's first sentence (torch's
    zip and weights_only errors go on for lines), never cut mid-word."""
    if isinstance(exc, CheckpointException) and exc.failures:  # DCP's: a traceback per rank
        exc = next(iter(exc.failures.values()))[0]
    if isinstance(exc, pickle.UnpicklingError):  # weights_only refused a class
        return "it holds objects other than tensors and plain values, which are never loaded"
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    first = first.split(". ")[0].rstrip(".")
    if len(first) > 160:
        first = first[:160].rsplit(" ", 1)[0] + " ..."
    if "zip archive" in first or "central directory" in first or "Errno" in first:
        first += " (cut short or damaged: a kill or a full disk while it was written)"
    return first


def write_failure(exc: BaseException, path: Path) -> str:
    """What a failed checkpoint write means, in words: torch reports a full disk as a
    RuntimeError (``enforce fail at inline_container.cc ... file write failed``) and DCP wraps
    each rank's error, so a disk with less than 64 MiB free is named as full; an OSError by its
    own words; anything else by its first line."""
    if isinstance(exc, CheckpointException) and exc.failures:
        exc = next(iter(exc.failures.values()))[0]
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    try:
        if shutil.disk_usage(path.parent).free < 64 << 20:
            return os.strerror(errno.ENOSPC)
    except OSError:
        pass
    return short_reason(exc)


def write_error(final: Path, exc: BaseException) -> SystemExit:
    """The one line with which every rank stops when a DCP checkpoint cannot be written; the
    older checkpoints are untouched (the new one was never renamed into place)."""
    return SystemExit(
        f"could not write checkpoint {final}: {write_failure(exc, final)}. Nothing was replaced "
        f"(the partial write stays in {_partial_dir(final).name}, removed by the next save). Free "
        f"disk space or fix the permissions of {final.parent}, then run the same command again: "
        "resume=auto continues from the newest checkpoint"
    )


def _tensor_keys(obj: Any) -> list[str]:
    """The DCP keys that a skeleton refers to."""
    if isinstance(obj, str) and obj.startswith(_TENSOR):
        return [obj.removeprefix(_TENSOR)]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [k for v in obj for k in _tensor_keys(v)]
    return []
