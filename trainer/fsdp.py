"""Fully sharded data parallelism (``parallel=fsdp``) with torch's FSDP2 (``fully_shard``).

As torchtitan does: one FSDP unit per transformer block and one for the root (the embeddings,
the final LayerNorm and the tied head), each block resharded after its forward (its parameters
are gathered again for the backward) and the root kept gathered from its forward to its backward
(it is needed first in the backward anyway). Parameters, gradients and optimizer state are
DTensors sharded along dim 0 over every rank; the model, the optimizer and their state dicts keep
their names and ids, so checkpoints have the keys of a DDP run (docs/fsdp.md).

With one process there is nothing to shard: as torchtitan, ``parallel=fsdp`` then runs the plain
model (the same code path as DDP's one process).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

log = logging.getLogger(__name__)


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` is (the root of) an FSDP2 model."""
    return isinstance(model, FSDPModule)


def fsdp_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules that become FSDP units, innermost first: every block, then the root."""
    blocks = getattr(getattr(model, "transformer", None), "h", None)
    if blocks is None:
        raise ValueError(
            f"parallel=fsdp shards model.transformer.h block by block; {type(model).__name__} "
            "has no such ModuleList: use parallel=ddp"
        )
    return [*blocks, model]


def shard_model(model: torch.nn.Module, device: torch.device, world_size: int,
                param_dtype: torch.dtype) -> torch.nn.Module:  # fmt: skip
    """``fully_shard`` each block, then the root, over a 1-D mesh of ``world_size`` ranks; in
    place (the module keeps its class's behaviour and its parameter names), returned too.

    ``param_dtype`` other than float32 (bf16 on GPUs): the blocks' parameters are gathered and
    computed in it while gradients are reduced in float32 onto the float32 sharded master
    weights. The residual stream stays float32, as under DDP with autocast: the root (the
    embeddings, the final LayerNorm, the tied head) is gathered in float32, so the embeddings
    return float32 (autocast casts the head's weight for its matmul, as under DDP), and the
    blocks' inputs are not cast (``cast_forward_inputs=False``; FSDP2's default would cast each
    block's input, the residual stream, to bf16). What differs from DDP is the blocks'
    LayerNorm gains and biases, gathered in bf16 (docs/fsdp.md, "Mixed precision")."""
    mesh = init_device_mesh(device.type, (world_size,))
    low = None if param_dtype == torch.float32 else param_dtype
    block_policy = MixedPrecisionPolicy(
        param_dtype=low, reduce_dtype=torch.float32, cast_forward_inputs=False
    )
    root_policy = MixedPrecisionPolicy(reduce_dtype=torch.float32, cast_forward_inputs=False)
    *blocks, root = fsdp_units(model)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=block_policy, reshard_after_forward=True)
    fully_shard(root, mesh=mesh, mp_policy=root_policy, reshard_after_forward=False)
    return model


def shard_like(value: object, param: torch.Tensor) -> object:
    """``value`` (a full tensor of an optimizer's state) sharded as the DTensor ``param``
    (Shard(0) on its mesh) when it has at least one dimension: a state shaped as the parameter,
    and also one that is not (SOAP's GG_i and Q_i, NorMuon's row moments: sharded by their own
    rows, docs/fsdp-optimizers.md); anything else (a step count, a scalar) unchanged."""
    if (
        isinstance(param, DTensor)
        and isinstance(value, torch.Tensor)
        and not isinstance(value, DTensor)
        and value.ndim >= 1
    ):
        local = value.to(device=param.to_local().device, dtype=param.dtype)
        # Every rank holds the same full value: distribute_tensor keeps this rank's chunk.
        return distribute_tensor(local, param.device_mesh, param.placements)
    return value


def rebuild_optimizer(
    old: torch.optim.Optimizer, build: Callable[[], torch.optim.Optimizer]
) -> torch.optim.Optimizer:
    """A new optimizer over the sharded parameters (``build``) holding ``old``'s state (a resume:
    full tensors loaded before sharding) sharded as those parameters.

    FSDP2 replaces each parameter with a DTensor, so the optimizer built before it points at
    parameters the model no longer has; the new one has the same groups and ids."""
    state = old.state_dict()
    new = build()
    params = [p for g in new.param_groups for p in g["params"]]
    if len(params) != sum(len(g["params"]) for g in state["param_groups"]):
        raise AssertionError("the optimizer's parameters changed under fully_shard")
    state["state"] = {
        i: {k: shard_like(v, params[i]) for k, v in s.items()} for i, s in state["state"].items()
    }
    new.load_state_dict(state)
    return new


def set_gradient_sync(model: torch.nn.Module, sync: bool) -> None:
    """FSDP2's ``no_sync``: with ``sync=False`` the backward accumulates unsharded gradients and
    reduce-scatters nothing (the micro-steps before the last of a step)."""
    assert isinstance(model, FSDPModule)
    model.set_requires_gradient_sync(sync)


def full_norm(norm: torch.Tensor) -> torch.Tensor:
    """A norm computed over DTensor gradients as a plain tensor (the whole model's norm)."""
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def reshard(model: torch.nn.Module) -> None:
    """Free every gathered parameter (the root keeps its own after a forward without backward,
    such as evaluation's), so the state dict and memory are the sharded ones again."""
    for module in _fsdp_modules(model):
        module.reshard()


def _fsdp_modules(model: torch.nn.Module) -> Iterator[FSDPModule]:
    return (m for m in model.modules() if isinstance(m, FSDPModule))


def has_dtensors(state: dict) -> bool:
    """Whether a (model) state dict holds DTensors (a sharded model's)."""
    return any(isinstance(v, DTensor) for v in state.values())
