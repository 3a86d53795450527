"""Optimizers on sharded parameters: FSDP2's ``fully_shard`` (DTensor, ``Shard(0)``, one mesh dim).

Under ``torch.distributed.fsdp.fully_shard`` every parameter, its gradient and every state
tensor made with ``zeros_like(p)`` is a DTensor whose rank-local piece is a block of rows (dim 0
cut as ``torch.chunk`` cuts it; a rank may hold no rows). The core (optim/core.py) then:

- runs every element-wise piece (the MARS correction, momenta, Adam moments, sign, decay, the
  step) on the local blocks (``to_local()``: views that share the parameter's storage), so the
  foreach, per-tensor and compiled paths see plain tensors;
- computes what needs the whole tensor over the whole tensor: the norms of the ``tensor`` and
  ``global`` clips are a local sum of squares all-reduced over the mesh (``clip_sharded_``);
- gives Newton-Schulz whole matrices: each matrix has one owner rank (``owners``: largest
  first, to the least-loaded rank); per batch of same-shape matrices one all-to-all in the
  Newton-Schulz dtype brings the row blocks to their owners, which orthogonalise them (batched)
  and one more sends the results' row blocks back (``orthogonalise_sharded``), so the work is
  split over the ranks, and the scale rules read the full shape (a DTensor's ``shape`` is the
  global one).

Anything else (a 2-D mesh as HSDP, ``Shard(1)``, ``Replicate``, parameters on two meshes) is
refused with a ValueError naming it. Plain tensors take the unchanged path. docs/fsdp-optimizers.md.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist

Tensors = list[torch.Tensor]


def _dtensor():
    """torch's DTensor module if it was imported (a DTensor exists only then), else None.
    Not imported here: it costs seconds at start-up, for runs that never shard."""
    return sys.modules.get("torch.distributed.tensor")


def _is_dtensor(t) -> bool:
    mod = _dtensor()
    return mod is not None and isinstance(t, mod.DTensor)


def is_sharded(t: torch.Tensor) -> bool:
    """Whether ``t`` is a DTensor; one this module cannot run on raises ValueError."""
    if not _is_dtensor(t):
        return False
    if t.device_mesh.ndim != 1 or tuple(t.placements) != (_dtensor().Shard(0),):
        raise ValueError(
            f"a DTensor of shape {tuple(t.shape)} with placements {tuple(t.placements)} on a "
            f"{t.device_mesh.ndim}-D mesh: the optimizers here run on FSDP2's Shard(0) over one "
            "mesh dim only (fully_shard on a 1-D mesh); HSDP, tensor parallel and other "
            "placements are not supported"
        )
    return True


def local(t: torch.Tensor) -> torch.Tensor:
    """The rank-local block of a DTensor (a view of its storage), or ``t`` itself."""
    return t.to_local() if _is_dtensor(t) else t


def local_state(state: dict) -> dict:
    """A new dict: ``state`` with each DTensor replaced by its local block (the same storage)."""
    return {k: local(v) for k, v in state.items()}


def group_of(shards: list) -> dist.ProcessGroup:
    """The process group of the mesh every DTensor of ``shards`` (None: plain) lives on."""
    meshes = {s.device_mesh for s in shards if s is not None}
    if len(meshes) != 1:
        raise ValueError(
            f"the sharded parameters of one optimizer live on {len(meshes)} device meshes; "
            "all must share one mesh (fully_shard every module with the same mesh)"
        )
    return meshes.pop().get_group()


def whole(local_t: torch.Tensor, like) -> torch.Tensor:
    """``local_t`` (a block shaped as ``like``'s local block) as a DTensor shaped as ``like``."""
    return _dtensor().DTensor.from_local(local_t, like.device_mesh, like.placements, run_check=False,
                              shape=like.shape, stride=like.stride())  # fmt: skip


def clip_sharded_(tensors: Tensors, shards: list, scope: str) -> None:
    """``clip_unit_norm_`` (optim/functional.py) where ``tensors[i]`` is the local block of the
    DTensor ``shards[i]`` (None: a whole plain tensor): per tensor (``tensor``) or jointly
    (``global``), ``c / max(1, ||c||)`` with ``||c||`` over the whole tensor. The sums of squares
    of the blocks are all-reduced in one call; no host synchronisation on NCCL."""
    if scope == "none" or not tensors:
        return
    dtype = torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32
    sq = torch.stack([n.to(dtype) for n in torch._foreach_norm(tensors)]).square()
    idx = [i for i, s in enumerate(shards) if s is not None]
    if len(idx) == len(tensors):  # FSDP2: every tensor sharded
        dist.all_reduce(sq, group=group_of(shards))
    elif idx:  # picked by Python indices (an index tensor would be a host-to-device copy)
        part = torch.stack([sq[i] for i in idx])
        dist.all_reduce(part, group=group_of(shards))
        whole_sq = dict(zip(idx, part.unbind(0)))
        sq = torch.stack([whole_sq.get(i, v) for i, v in enumerate(sq.unbind(0))])
    if scope == "tensor":
        scales = sq.sqrt().clamp_min(1.0).reciprocal()
        torch._foreach_mul_(tensors, [s.to(t.dtype) for s, t in zip(scales.unbind(0), tensors)])
    elif scope == "global":
        torch._foreach_div_(tensors, sq.sum().sqrt().clamp_min(1.0).to(tensors[0].dtype))
    else:
        raise ValueError(f"unknown clip scope {scope!r}; valid scopes: tensor, global, none")


def ns_flops(shape: tuple[int, ...], steps: int = 5) -> int:
    """Floating-point operations of ``steps`` quintic Newton-Schulz steps on a matrix of
    ``shape`` (optim/functional.py ``newton_schulz``, on its wide orientation ``(m, n)``,
    ``m <= n``): per step ``A = X X^T`` (2 m^2 n), ``A @ A`` (2 m^3), ``B @ X`` (2 m^2 n)."""
    m, n = sorted(shape[-2:])
    return steps * (4 * m * m * n + 2 * m**3)


def owners(shapes: list[tuple[int, ...]], world: int, merge: bool = False,
           isolate: bool = False) -> list[int]:  # fmt: skip
    """The rank that orthogonalises each matrix: largest cost (``ns_flops``) first, each to the
    least-loaded rank (ties: the lower index, the lower rank) among those holding fewer than
    ``ceil(n / world)`` of its batch (``n`` the batch's matrices; a batch: one shape, with
    ``merge`` one shape up to transposition), so that the batches stay balanced over the ranks.
    ``isolate``: where the largest matrix alone on rank 0 and the others split so over the
    other ranks gives a lower maximum load (a tied embedding beside GPT-2's blocks), that split.
    The same on every rank: it depends on the global shapes and their order only. Used for
    FSDP2's owners and DDP's split (optim/newton_schulz.py ``assign``, with ``isolate``)."""
    cost = [ns_flops(s) for s in shapes]
    batch = [tuple(sorted(s)) if merge else tuple(s) for s in shapes]
    out = _greedy(range(len(shapes)), cost, batch, list(range(world)))
    if isolate and world > 1 and shapes:
        big = min(range(len(shapes)), key=lambda i: (-cost[i], i))
        rest = [i for i in range(len(shapes)) if i != big]
        alone = _greedy(rest, cost, batch, list(range(1, world)))
        alone[big] = 0
        if _max_load(alone, cost, world) < _max_load(out, cost, world):
            return alone
    return out


def _greedy(idx, cost: list[int], batch: list[tuple], ranks: list[int]) -> list[int]:
    """``owners``' rule over the matrices ``idx`` and ``ranks`` (a list of the others: 0)."""
    chosen = list(idx)
    count = {b: sum(1 for i in chosen if batch[i] == b) for b in {batch[i] for i in chosen}}
    cap = {b: -(-n // len(ranks)) for b, n in count.items()}
    load, held, out = dict.fromkeys(ranks, 0), {}, [0] * len(cost)
    for i in sorted(chosen, key=lambda i: (-cost[i], i)):
        free = [r for r in ranks if held.get((batch[i], r), 0) < cap[batch[i]]]
        r = min(free, key=lambda r: (load[r], r))
        out[i], load[r] = r, load[r] + cost[i]
        held[(batch[i], r)] = held.get((batch[i], r), 0) + 1
    return out


def _max_load(own: list[int], cost: list[int], world: int) -> int:
    load = [0] * world
    for r, c in zip(own, cost):
        load[r] += c
    return max(load)


def orthogonalise_sharded(us: list, ortho: Callable[[Tensors], Tensors],
                          dtype: torch.dtype | None, divisor: float | None = None) -> list:  # fmt: skip
    """``ortho`` of each whole matrix ``u / divisor`` of the DTensors ``us`` (Shard(0)), split
    over the ranks; ``ortho`` (given no divisor) returns each result in ``dtype`` (None: the
    matrix's own dtype).

    Each matrix has an owner (``owners``). Per batch of same-shape matrices, one
    ``all_to_all_single`` sends every rank's row block of each matrix (unpadded, ``OwnerTrip``;
    divided and cast to ``dtype`` first: bf16 by default, half the bytes, and the bits
    Newton-Schulz's own cast would make) to its owner; the owner runs
    ``ortho`` on all its whole matrices of the batch in one call, and one more all-to-all sends
    each rank its row block of every result. Two collectives per shape a step (not a gather and a
    scatter per matrix). Returns DTensors laid out as ``us``; every rank takes part in each.
    """
    group = group_of(us)
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    own = owners([tuple(u.shape) for u in us], world)
    out: list = [None] * len(us)
    batches: dict[tuple, list[int]] = {}
    for i, u in enumerate(us):
        batches.setdefault((tuple(u.shape), u.dtype), []).append(i)
    for idx in batches.values():
        for i, r in zip(idx, _batch([us[i] for i in idx], [own[i] for i in idx], rank, world,
                                    group, ortho, dtype, divisor)):  # fmt: skip
            out[i] = r
    return out


class OwnerTrip:
    """The layout of one shape's two all-to-alls (``orthogonalise_sharded``, and the engine's,
    optim/engine/ns_shards.py): ``own[j]`` the owner of matrix ``j`` of the shape ``(rows,
    cols)``. Nothing is padded: rank r sends its ``lens[r]`` rows (``torch.chunk``'s cut) of
    each matrix to the matrix's owner, and receives its ``lens[r]`` rows of each result.

    ``order``: the matrices by owner (rank 0's first), the layout of a rank's send buffer (one
    ``block`` of ``lens[rank] * cols`` elements each) and of the results it gets back;
    ``send_splits[r]``: what this rank sends owner r (and gets back from it);
    ``recv_splits[r]``: what it receives from rank r of the ``mine`` matrices it owns (and
    sends rank r back)."""

    def __init__(self, own: list[int], shape: tuple[int, int], rank: int, world: int) -> None:
        rows, cols = shape
        self.shape = (rows, cols)
        self.lens = [b - a for a, b in (local_rows(rows, r, world) for r in range(world))]
        self.starts = [sum(self.lens[:r]) for r in range(world)]
        dest = [[j for j, o in enumerate(own) if o == r] for r in range(world)]
        self.order = [j for d in dest for j in d]
        self.mine, self.block = len(dest[rank]), self.lens[rank] * cols
        self.send_splits = [len(d) * self.block for d in dest]
        self.recv_splits = [self.mine * n * cols for n in self.lens]

    def assemble(self, recv: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The whole matrices this rank owns, ``(mine, rows, cols)`` into ``out``, from the row
        blocks ``recv`` received."""
        at = 0
        for start, n, size in zip(self.starts, self.lens, self.recv_splits):
            out[:, start : start + n].copy_(recv[at : at + size].view(self.mine, n, self.shape[1]))
            at += size
        return out

    def scatter(self, results, back: torch.Tensor) -> torch.Tensor:
        """Each rank's rows of ``results`` (this rank's matrices, whole: a stacked tensor or a
        list) into ``back``, rank 0's first."""
        at = 0
        for start, n, size in zip(self.starts, self.lens, self.recv_splits):
            part = back[at : at + size].view(self.mine, n, self.shape[1])
            if isinstance(results, torch.Tensor):
                part.copy_(results[:, start : start + n])
            else:
                for j, r in enumerate(results):
                    part[j].copy_(r[start : start + n])
            at += size
        return back


def _batch(us: list, own: list[int], rank: int, world: int, group, ortho, dtype, divisor) -> list:
    """``orthogonalise_sharded`` for matrices of one shape: there, then back (two all-to-alls,
    laid out by ``OwnerTrip``)."""
    trip = OwnerTrip(own, tuple(us[0].shape), rank, world)
    wire = dtype or us[0].dtype
    send = torch.empty(len(us) * trip.block, dtype=wire, device=local(us[0]).device)
    for k, j in enumerate(trip.order):  # each block where its owner's share of the buffer starts
        block = local(us[j]) if divisor is None else local(us[j]) / divisor
        send[k * trip.block : (k + 1) * trip.block].view_as(block).copy_(block)
    recv = send.new_empty(sum(trip.recv_splits))
    dist.all_to_all_single(recv, send, trip.recv_splits, trip.send_splits, group=group)
    wholes = trip.assemble(recv, send.new_empty((trip.mine, *trip.shape)))
    results = ortho(list(wholes.unbind(0))) if trip.mine else []
    assert all(r.dtype == wire for r in results), "ortho returned another dtype"
    back = trip.scatter(results, send.new_empty(sum(trip.recv_splits)))
    got = torch.empty_like(send)
    dist.all_to_all_single(got, back, trip.send_splits, trip.recv_splits, group=group)
    at = {j: k for k, j in enumerate(trip.order)}
    return [whole(got[at[j] * trip.block : (at[j] + 1) * trip.block].view_as(local(u)), u)
            for j, u in enumerate(us)]  # fmt: skip


def all_to_all_traffic(shapes: list[tuple[int, int]], world: int, itemsize: int = 2) -> list[dict]:
    """The FSDP2 owners' collectives a step, from the assignment (no process needed): per batch
    of same-shape matrices two all-to-alls (``OwnerTrip``: nothing padded), each rank sending
    its row block of each matrix there (rank 0, holding ``ceil(rows / W)`` rows, the most) and,
    as an owner, each rank its rows of every result it computed back. One dict per batch: its
    shape, ``count`` (2), and per rank the most bytes sent each way."""
    own, out = owners(shapes, world), []
    batches: dict[tuple, list[int]] = {}
    for i, s in enumerate(shapes):
        batches.setdefault(tuple(s), []).append(i)
    for shape, idx in batches.items():
        block = math.ceil(shape[0] / world) * shape[1] * itemsize
        most = max(sum(1 for i in idx if own[i] == r) for r in range(world))
        out.append({"shape": shape, "count": 2, "there": len(idx) * block,
                    "back": most * shape[0] * shape[1] * itemsize})  # fmt: skip
    return out


def ns_shard_buffer_bytes(shapes: list[tuple[int, int]], world: int, itemsize: int = 2) -> int:
    """Bytes of the buffers the engine's sharded Newton-Schulz (optim/engine/ns_shards.py)
    holds on the rank that holds most, in the NS dtype: its row block of every matrix twice
    (``send``, ``got``) and, of each matrix it owns, the rows it receives, the whole matrix and
    the rows it sends back (``recv``, ``stack``, ``back``)."""
    own, most = owners(shapes, world), 0
    for r in range(world):
        blocks = sum((stop - start) * s[1] for s in shapes
                     for start, stop in [local_rows(s[0], r, world)])  # fmt: skip
        owned = sum(math.prod(s) for s, o in zip(shapes, own) if o == r)
        most = max(most, (2 * blocks + 3 * owned) * itemsize)
    return most


# --- whole-matrix preconditioners on owner ranks (SOAP, MARS-SOAP): docs/fsdp-optimizers.md ---


def local_rows(rows: int, rank: int, world: int) -> tuple[int, int]:
    """``(start, stop)`` of the rows rank ``rank`` holds of a dim 0 of ``rows`` cut as Shard(0)
    cuts it (``torch.chunk``: ``ceil(rows / W)`` rows a rank, the last ranks fewer or none)."""
    chunk = math.ceil(rows / world) if rows else 0
    start = min(rows, rank * chunk)
    return start, min(rows, start + chunk)


def sharded_zeros(like: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Zeros of global ``shape`` as a DTensor sharded as the DTensor ``like`` (Shard(0) on its
    mesh): each rank allocates its own rows only, and nothing is communicated. Optimizer state
    that is not shaped as its parameter (SOAP's ``GG_i``, ``Q_i``; NorMuon's row moments) lives
    so, which DCP saves and reshards as any other sharded state (docs/fsdp-optimizers.md)."""
    group = group_of([like])
    start, stop = local_rows(shape[0], dist.get_rank(group), dist.get_world_size(group))
    block = torch.zeros((stop - start, *shape[1:]), dtype=like.dtype, device=local(like).device)
    stride = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
    return _dtensor().DTensor.from_local(block, like.device_mesh, like.placements,
                                         run_check=False, shape=torch.Size(shape), stride=stride)  # fmt: skip


def on_owners(blocks: list[Tensors], shapes: list[list[tuple]], out_shapes: list[list[tuple]],
              fn: Callable[[list[int], list[Tensors]], list[Tensors]], group,
              costs: list[tuple]) -> list[Tensors]:  # fmt: skip
    """Whole-tensor work ``fn`` for items whose tensors are Shard(0) row blocks, on one owner
    rank per item, and each rank's row blocks of the results back.

    ``blocks[i]``: this rank's blocks of item ``i``'s tensors (one dtype an item), of global
    shapes ``shapes[i]``; the owner of item ``i`` is ``owners(costs)[i]`` (the same rule as
    Newton-Schulz's, the same on every rank). One ``all_to_all_single`` per dtype sends every
    rank's blocks (padded to ``ceil(rows / W)`` rows) to the owners, which call ``fn`` once on
    the whole tensors of all the items they own (a list per item, in the order of ``blocks``)
    and get a list per item of whole tensors of shapes ``out_shapes[i]``; one more sends each
    rank its rows of those. Returns this rank's blocks of the results, item by item. Every rank
    takes part in each collective (a rank owning nothing sends and receives its share)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    own = owners(costs, world)
    out: list = [None] * len(blocks)
    by_dtype: dict[torch.dtype, list[int]] = {}
    for i, b in enumerate(blocks):
        by_dtype.setdefault(b[0].dtype, []).append(i)
    for idx in by_dtype.values():
        got = _owner_round(
            [blocks[i] for i in idx],
            [shapes[i] for i in idx],
            [out_shapes[i] for i in idx],
            [own[i] for i in idx],
            rank,
            world,
            group,
            lambda mine, wholes, idx=idx: fn([idx[j] for j in mine], wholes),
        )
        for i, r in zip(idx, got):
            out[i] = r
    return out


def _padded(shape: tuple, world: int) -> tuple[int, int]:
    """``(chunk rows, elements of a padded block)`` of a Shard(0) tensor of ``shape``."""
    chunk = math.ceil(shape[0] / world)
    return chunk, chunk * math.prod(shape[1:])


def _owner_round(blocks, shapes, out_shapes, own, rank, world, group, fn) -> list[Tensors]:
    """``on_owners`` for the items of one dtype: there, ``fn``, back (two all-to-alls)."""
    dtype, device = blocks[0][0].dtype, blocks[0][0].device
    size_in = [sum(_padded(s, world)[1] for s in ss) for ss in shapes]
    size_out = [sum(_padded(s, world)[1] for s in ss) for ss in out_shapes]
    dest = [[i for i, o in enumerate(own) if o == r] for r in range(world)]
    mine = dest[rank]
    send = torch.zeros(sum(size_in), dtype=dtype, device=device)
    at = 0
    for i in (i for d in dest for i in d):  # each item's blocks where its owner's share starts
        for t, s in zip(blocks[i], shapes[i]):
            send[at : at + t.numel()].copy_(t.reshape(-1))
            at += _padded(s, world)[1]
    my_in = sum(size_in[i] for i in mine)
    recv = send.new_empty(world * my_in)
    dist.all_to_all_single(recv, send, [my_in] * world,
                           [sum(size_in[i] for i in d) for d in dest], group=group)  # fmt: skip
    segments, wholes, at = recv.view(world, my_in), [], 0
    for i in mine:
        item = []
        for s in shapes[i]:
            chunk, n = _padded(s, world)
            item.append(segments[:, at : at + n].reshape(world * chunk, *s[1:])[: s[0]])
            at += n
        wholes.append(item)
    results = fn(mine, wholes) if mine else []
    my_out = sum(size_out[i] for i in mine)
    back = send.new_zeros((world, my_out))
    at = 0
    for i, res in zip(mine, results):
        for r, s in zip(res, out_shapes[i]):
            assert tuple(r.shape) == tuple(s), "fn returned another shape"
            chunk, n = _padded(s, world)
            padded = r.new_zeros((world * chunk, *s[1:]))
            padded[: s[0]].copy_(r)
            back[:, at : at + n].copy_(padded.view(world, n))  # each rank's rows, in its place
            at += n
    sizes = [sum(size_out[i] for i in d) for d in dest]
    got = send.new_empty(sum(sizes))
    dist.all_to_all_single(got, back.view(-1), sizes, [my_out] * world, group=group)
    out: list = [None] * len(blocks)
    at = 0
    for i in (i for d in dest for i in d):
        item = []
        for s in out_shapes[i]:
            chunk, n = _padded(s, world)
            start, stop = local_rows(s[0], rank, world)
            item.append(got[at : at + n].view(chunk, *s[1:])[: stop - start])
            at += n
        out[i] = item
    return out
