"""A step's unit: the bucket (the tensors of one param group that share a rule this step), the
rule of each tensor (``route``: MARS's non-2-D AdamW rule, Adam for what a preconditioner does
not handle) and the step applied (``apply_step``). optim/core.py builds the buckets each step;
optim/routes.py decides which route steps each.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from optim import sharded
from optim.momentum import MOMENTA, Momentum
from optim.preconditioners import PRECONDITIONERS, Preconditioner, Step

Tensors = list[torch.Tensor]


@dataclass
class Bucket:
    """Tensors of one group that share a rule this step, with their gradients and corrections."""

    view: dict
    momentum: Momentum
    preconditioner: Preconditioner
    params: Tensors = field(default_factory=list)
    states: list[dict] = field(default_factory=list)
    gs: Tensors = field(default_factory=list)
    cs: Tensors = field(default_factory=list)
    # FSDP2 (optim/sharded.py): params, states and gs above are then the rank-local blocks;
    # ``shards`` holds each tensor's DTensor parameter (None: a plain tensor) and ``owners`` the
    # optimizer's own state dicts (``states`` are views of them with local blocks)
    shards: list = field(default_factory=list)
    owners: list[dict] = field(default_factory=list)


def route(p: torch.Tensor, group: dict) -> tuple[str, dict]:
    """The rule for ``p`` in ``group``: a key and the group as that rule reads it."""
    if group.get("split_1d") and p.ndim != 2:
        return "1d", {
            **group,
            "lr": group["lr"] * group["lr_1d_factor"],
            "betas": group["betas_1d"],
            "weight_decay": group["weight_decay_1d"],
            "variance_reduction": False,
            "amsgrad": False,
            "momentum_form": "ema",
            "preconditioner": "adam",
        }
    if not PRECONDITIONERS[group["preconditioner"]].handles(p):
        return "adam", {**group, "preconditioner": "adam"}
    return "main", group


def apply_step(params: Tensors, step: Step, foreach: bool) -> None:
    """``p = p * keep - step_size * num / den``: decoupled decay, then the preconditioned step."""
    if foreach:
        torch._foreach_mul_(params, step.keeps)
        if step.dens is not None:
            torch._foreach_addcdiv_(params, step.nums, step.dens, [-s for s in step.step_sizes])
            return
        # foreach add takes one alpha: one call per distinct step size (Newton-Schulz: one per
        # shape), never one per tensor, and the same rounding as the loop's ``add_(alpha=)``
        by_size: dict[float, list[int]] = {}
        for i, size in enumerate(step.step_sizes):
            by_size.setdefault(size, []).append(i)
        for size, idx in by_size.items():
            torch._foreach_add_([params[i] for i in idx], [step.nums[i] for i in idx],
                                alpha=-size)  # fmt: skip
        return
    for i, p in enumerate(params):
        p.mul_(step.keeps[i])
        if step.dens is not None:
            p.addcdiv_(step.nums[i], step.dens[i], value=-step.step_sizes[i])
        else:
            p.add_(step.nums[i], alpha=-step.step_sizes[i])


def probe(p: torch.Tensor, view: dict) -> Bucket:
    """A one-tensor bucket of ``p`` under ``view``, without state: what a route decision reads
    of it before any step (``VarianceReduced.device_skip_cost``)."""
    precond = PRECONDITIONERS[view["preconditioner"]](view)
    shard = p if sharded.is_sharded(p) else None
    return Bucket(view, MOMENTA[view["momentum_form"]], precond, params=[sharded.local(p)],
                  shards=[shard])  # fmt: skip


def clip_scope(b: Bucket) -> str | None:
    """The clip of the bucket's MARS correction (``tensor``, ``global``, ``none``), or None
    without the correction."""
    return b.view.get("clip") if b.view.get("variance_reduction") else None
