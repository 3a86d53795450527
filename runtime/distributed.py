"""Process-group plumbing: one code path for 1 process and N processes (torchrun).

NCCL on GPUs, gloo on CPU. Without torchrun's environment variables nothing is initialised and
the helpers below act as their single-process identities.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def pick_device(preference: str, local_rank: int) -> torch.device:
    """``auto`` picks CUDA when available, else CPU; ``cpu``/``cuda``/``mps`` force one."""
    if preference == "auto":
        preference = "cuda" if torch.cuda.is_available() else "cpu"
    if preference == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device=cuda was asked for but CUDA is not available; use device=cpu")
        return torch.device("cuda", local_rank)
    if preference in ("cpu", "mps"):
        return torch.device(preference)
    raise ValueError(f"unknown device {preference!r}; valid devices: auto, cpu, cuda, mps")


def init_distributed(device_preference: str = "auto") -> DistInfo:
    """Initialise the default process group when launched by torchrun, and pick the device."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_preference, local_rank)
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(minutes=30))
    return DistInfo(rank, local_rank, world_size, device)


def destroy() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """In-place sum over ranks (identity on one process)."""
    if dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank (identity on one process)."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank."""
    if not dist.is_initialized():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
