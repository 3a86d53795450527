"""Newton-Schulz buckets on FSDP2 shards, on the engine: the owners' path without leaving it.

Under ``fully_shard`` each rank holds a block of rows of every matrix (optim/sharded.py). A
Newton-Schulz bucket of such blocks takes the engine as an element-wise bucket does, with three
changes to the one-rank path (optim/engine/ns.py):

1. the pre-pass (``step_kernel``, ``DIRECTION=NS_OUT``: correction, clip, momentum, ``u`` in
   the Newton-Schulz dtype) writes each matrix's local block of ``u`` straight into its slice of
   a persistent send buffer, laid out by owner (each matrix's owner: optim/sharded.py
   ``owners``, the foreach path's rule, so the same matrices meet on the same ranks); the MARS
   clip's norms are the local blocks' sums all-reduced (optim/engine/launch.py
   ``_finish_sharded``), the trainer's clip folded as for every engine bucket;
2. per shape one ``all_to_all_single`` brings the row blocks to their owners, every shape's
   issued at once (``async_op``) before any Newton-Schulz runs; each owner waits for its
   shape's, assembles its whole matrices, runs the batched Newton-Schulz on them, and starts the
   all-to-all that sends each rank its rows of the results before it goes on to the next shape,
   so a shape's trip back overlaps the next shape's Newton-Schulz;
3. ``apply_kernel`` over the local blocks, reading each result where the trip back left it.

No block is padded: rank r sends each matrix's ``rows_r`` rows (``torch.chunk``'s cut: the last
ranks fewer or none) and receives its ``rows_r`` rows of each result, so the bytes on the wire
are the blocks' own. Every rank takes part in every collective (a rank holding no rows of a
shape, or owning none of its matrices, sends and receives empty shares). Under a device skip
flag the pre-pass and the update write nothing; the collectives and Newton-Schulz run on the last
step's buffers, as on one rank. A result equals the foreach owners' path's
(optim/newton_schulz.py ``_sharded``): the same blocks in the same dtype, the same owner, the
same batched call.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from optim import sharded
from optim.engine import layout as L
from optim.engine.tables import Plan
from optim.functional import newton_schulz


class ShardStack(sharded.OwnerTrip):
    """The matrices ``idx`` of one global shape ``(rows, cols)`` of a sharded Newton-Schulz
    bucket, laid out by ``OwnerTrip`` (optim/sharded.py; ``order`` holds bucket indices here):
    ``send``, this rank's block of each (the pre-pass's output slices, ``out``); ``recv``, from
    each rank its blocks of the matrices this rank owns; ``stack``, those whole (the
    Newton-Schulz input); ``back``, each rank's rows of this rank's results; ``got``, this
    rank's rows of every result in ``order`` (the update pass's source, ``plan``)."""

    def __init__(self, idx: list[int], own: list[int], blocks: list, shape: tuple[int, int],
                 dtype: torch.dtype, block: int, rank: int, world: int) -> None:  # fmt: skip
        super().__init__([own[i] for i in idx], shape, rank, world)
        self.order = [idx[j] for j in self.order]
        n, device = self.block, blocks[idx[0]].device
        self.send = torch.zeros(len(idx) * n, dtype=dtype, device=device)
        self.got = torch.zeros_like(self.send)
        self.out = {i: self.send[k * n : (k + 1) * n].view_as(blocks[i])
                    for k, i in enumerate(self.order)}  # fmt: skip
        self.recv = self.send.new_zeros(sum(self.recv_splits))
        self.back = torch.zeros_like(self.recv)
        self.stack = self.send.new_zeros((self.mine, *shape))
        self.plan = Plan({L.C_P: [blocks[i] for i in self.order]}, block)


class ShardStacks:
    """A sharded Newton-Schulz bucket's stacks, one per global shape (no merging of a shape with
    its transpose: a row block of one is not a row block of the other). ``blocks``: the local
    blocks (the pre-pass's ``C_P``), ``shards``: their DTensors (global shapes, the group)."""

    def __init__(self, blocks: list, shards: list, dtype: torch.dtype, block: int) -> None:
        self.group = sharded.group_of(shards)
        rank, world = dist.get_rank(self.group), dist.get_world_size(self.group)
        shapes = [tuple(s.shape) for s in shards]
        own = sharded.owners(shapes, world)
        by_shape: dict[tuple, list[int]] = {}
        for i, shape in enumerate(shapes):
            by_shape.setdefault(shape, []).append(i)
        self.stacks = [ShardStack(idx, own, blocks, shape, dtype, block, rank, world)
                       for shape, idx in by_shape.items()]  # fmt: skip
        self.out = [next(s.out[i] for s in self.stacks if i in s.out) for i in range(len(blocks))]
        self.tcols = [0] * len(blocks)
        self.dtype = dtype


def run(go, ln, pre, apply) -> None:
    """Newton-Schulz over the owners and the update per stack (after the pre-pass); ``apply(s,
    base)`` launches the update of stack ``s`` from ``base``. ``go.dry``: compile only (no
    collective, no Newton-Schulz: every rank compiles alike)."""
    stacks: ShardStacks = ln.stacks
    if go.dry:
        for s in stacks.stacks:
            if s.plan.nblocks:
                apply(s, s.got)
        return
    group = stacks.group
    there = [_all_to_all(s.recv, s.send, s.recv_splits, s.send_splits, group)
             for s in stacks.stacks]  # fmt: skip
    back = []
    for s, work in zip(stacks.stacks, there):
        _wait(work)
        if s.mine:
            wholes = s.assemble(s.recv, s.stack)
            s.scatter(newton_schulz(wholes, pre.steps, pre.eps, stacks.dtype, fused=_fused(ln)),
                      s.back)  # fmt: skip
        back.append(_all_to_all(s.got, s.back, s.send_splits, s.recv_splits, group))
    for s, work in zip(stacks.stacks, back):
        _wait(work)
        if s.plan.nblocks:
            apply(s, s.got)


def _fused(ln) -> bool:
    fused = ln.b.preconditioner.fused
    return fused if fused is not None else ln.plan.table.device.type == "cuda"


def _all_to_all(out: torch.Tensor, inp: torch.Tensor, out_splits: list[int],
                in_splits: list[int], group):  # fmt: skip
    """Start one all-to-all (a work handle; tests count and wrap it)."""
    return dist.all_to_all_single(out, inp, out_splits, in_splits, group=group, async_op=True)


def _wait(work) -> None:
    if work is not None:  # (NCCL: orders the streams, not the host)
        work.wait()
