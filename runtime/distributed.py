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


_OWNED = False  # whether init_distributed created the process group (and destroy may end it)


def adopt_submitit_environment() -> None:
    """Inside a job of Hydra's submitit launcher (Slurm, or local for tests) with several tasks,
    set torchrun's variables from the job's environment, so one code path serves both.

    The rendezvous port is derived from the job id: the local launcher runs a sweep's jobs at the
    same time, and Slurm may place two jobs on one node."""
    if "WORLD_SIZE" in os.environ or not os.environ.get("SUBMITIT_EXECUTOR"):
        return
    import submitit  # only inside submitit jobs

    env = submitit.JobEnvironment()
    if env.num_tasks <= 1:
        return
    digits = "".join(ch for ch in str(env.job_id) if ch.isdigit()) or "0"
    os.environ.update(
        RANK=str(env.global_rank),
        LOCAL_RANK=str(env.local_rank),
        WORLD_SIZE=str(env.num_tasks),
        MASTER_ADDR=env.hostnames[0],
        MASTER_PORT=str(20000 + int(digits) % 20000),
    )


_TIMEOUT = datetime.timedelta(minutes=30)


def _restart_safe_store() -> dict[str, Any]:
    """Under torchrun, the store of the process group, with keys of this restart attempt only.

    torchrun's agent hosts one store for every restart of its workers (``--max-restarts``), so
    the workers of a restart could read the addresses their killed predecessors published and
    fail to connect ("Connection refused"). Empty (env:// as usual) outside torchrun."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=_TIMEOUT
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return {
        "store": dist.PrefixStore(f"mars_gpt2/attempt_{attempt}", store),
        "rank": int(os.environ["RANK"]),
        "world_size": int(os.environ["WORLD_SIZE"]),
    }


def _backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init_distributed(device_preference: str = "auto") -> DistInfo:
    """Initialise the default process group when launched by torchrun (or a multi-task submitit
    job), and pick the device. A group that already exists (made once for a whole ``--multirun``
    sweep by ``train.py``) is reused and left for its creator to end."""
    global _OWNED
    adopt_submitit_environment()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_preference, local_rank)
    if world_size > 1 and dist.is_initialized():
        backend = dist.get_backend()
        if backend != _backend_for(device):
            raise ValueError(
                f"the process group uses {backend} but device={device.type}; on a GPU machine "
                "run CPU processes with CUDA_VISIBLE_DEVICES= (empty)"
            )
    elif world_size > 1:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(
            backend=_backend_for(device), timeout=_TIMEOUT, **_restart_safe_store()
        )
        _OWNED = True
    return DistInfo(rank, local_rank, world_size, device)


def init_for_sweep() -> bool:
    """Under torchrun, create the process group once for the whole process (every job of a
    ``--multirun`` sweep then runs over it, in the same order on every rank). Returns whether it
    was created; ``destroy(force=True)`` ends it."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return False
    device = pick_device("auto", int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend=_backend_for(device), timeout=_TIMEOUT, **_restart_safe_store())
    return True


def destroy(force: bool = False) -> None:
    """End the process group if ``init_distributed`` created it (or ``force``)."""
    global _OWNED
    if dist.is_initialized() and (_OWNED or force):
        dist.destroy_process_group()
        _OWNED = False


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
