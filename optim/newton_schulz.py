"""Newton-Schulz over many matrices: batched by shape, and split over the ranks of a DDP run.

``orthogonalise(us)`` returns ``NS5(u)`` (optim/functional.py ``newton_schulz``) for every matrix
of ``us``, computed in one of three ways that give the same numbers per matrix:

- per matrix (``batched=False``): one ``newton_schulz`` call per tensor; the readable reference.
- batched (default): the matrices of one shape (and dtype, device) are stacked to ``(B, m, n)``
  in the Newton-Schulz dtype and orthogonalised in one call (batched matmuls; a tall shape is
  transposed as a whole, as the single-matrix path does). Each matrix is still normalised by its
  own Frobenius norm, so a slice of the batch equals the single-matrix result (exactly in
  float64 up to the reduction order of the norm; close in bf16, where a batched GEMM may round
  differently from a single one).
- split over ranks (``distributed=True`` and ``torch.distributed`` initialised with world size
  W > 1): every matrix of the call has one owner rank, by its Newton-Schulz FLOPs (``assign``:
  optim/sharded.py ``owners``, largest first to the least-loaded rank, the same on every rank;
  a lone large matrix, a tied embedding, on a rank of its own where that lowers the most FLOPs
  a rank computes). Per shape, each rank orthogonalises the matrices it owns (one batched call),
  and the results move only once each (``layout``): one all-gather of the ``k`` slots every rank
  fills (``k``: the fewest any rank owns of that shape; none where a shape has fewer matrices
  than ranks), then each matrix beyond them broadcast from its owner; no slot is padded, and a
  rank receives the results' bytes less its own (``received_bytes``; the padded all-gather this
  replaced moved W times the fullest rank's slots: ``split_traffic``'s ``padded_received``).
  Bit for bit the same on all ranks. Every rank takes part in each collective, in the same
  order; they are asynchronous (each overlaps the next shape's work; all are waited on before
  returning: on NCCL a wait orders the streams, not the host), and there is no other host
  synchronisation. In the Newton-Schulz dtype (bf16: half the bytes; casting to the parameter
  dtype afterwards is exact either way). ``rank_flops`` gives each rank's FLOPs a step from the
  assignment, ``ns_buffer_bytes`` the buffers a rank holds for it.

As Keller Jordan's and the MARS repo's Muon, which split the matrices over ranks the same way;
Moonlight and the official MARS-M compute every matrix on every rank (``distributed=False``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.distributed as dist

from optim import sharded
from optim.functional import newton_schulz

Tensors = list[torch.Tensor]


def split_world(distributed: bool) -> tuple[int, int]:
    """``(rank, world size)`` of the split; ``(0, 1)`` when off or not in a distributed run."""
    if not distributed or not dist.is_available() or not dist.is_initialized():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def orthogonalise(
    us: Tensors,
    *,
    steps: int,
    eps: float,
    dtype: torch.dtype | None,
    divisor: float | None = None,
    batched: bool = True,
    distributed: bool = True,
    fused: bool = False,
    cast_back: bool = False,
) -> Tensors:
    """``NS(u / divisor)`` (``divisor`` None: ``NS(u)``) for each matrix, in ``dtype``
    (None: the matrix's own dtype), or in the matrix's own dtype with ``cast_back`` (one cast
    per shape). ``fused``: the iteration's multiply-adds as ``baddbmm`` (3 ops a step instead of
    8; rounds differently from the official arithmetic, optim/functional.py).
    DTensors (FSDP2) are orthogonalised whole, each on one owner rank, and returned as DTensors
    (``_sharded``); ``distributed`` does not apply to them (their work is always split)."""
    if any(sharded.is_sharded(u) for u in us):
        return _sharded(us, steps=steps, eps=eps, dtype=dtype, divisor=divisor, batched=batched,
                        distributed=distributed, fused=fused, cast_back=cast_back)  # fmt: skip
    rank, world = split_world(distributed)
    own = assign([tuple(u.shape) for u in us], world, merged=fused)
    out: list[torch.Tensor | None] = [None] * len(us)
    pending = []  # the gathers run while the next shape is orthogonalised
    for idx in _same_shape(us, merge_transposed=fused).values():
        tall = [fused and us[i].size(-2) > us[i].size(-1) for i in idx]
        xs = [us[i].mT if t else us[i] for i, t in zip(idx, tall)]  # NS(u) = NS(u^T)^T
        dt = dtype or xs[0].dtype
        back = xs[0].dtype if cast_back else dt
        if world > 1:
            mine = [own[i] for i in idx]
            results, work = _split(xs, mine, rank, world, steps, eps, dt, divisor, batched, fused)
            pending.append(work)  # cast after the wait: see below
        elif batched:
            stack = newton_schulz(_stack(xs, dt, divisor), steps, eps, dt, fused=fused)
            results = list(stack.to(back).unbind(0))
        else:
            results = [newton_schulz(_scaled(x, divisor), steps, eps, dt, fused=fused).to(back)
                       for x in xs]  # fmt: skip
        for i, t, r in zip(idx, tall, results):
            out[i] = r.mT if t else r
    for work in pending:
        for w in work:
            if w is not None:  # (a test's stand-in collective returns none)
                w.wait()
    if world > 1 and cast_back:
        out = [o.to(u.dtype) for o, u in zip(out, us)]
    return out


def _sharded(us: Tensors, *, dtype: torch.dtype | None, cast_back: bool, **kw) -> Tensors:
    """``orthogonalise`` where some of ``us`` are DTensors: those whole on their owner ranks
    (optim/sharded.py; the results travel back in the Newton-Schulz dtype, cast after), the
    plain ones as ``orthogonalise`` does. The results in the order of ``us``."""
    idx = [i for i, u in enumerate(us) if sharded.is_sharded(u)]
    rest = [i for i, u in enumerate(us) if not sharded.is_sharded(u)]
    out: list = [None] * len(us)
    for i, o in zip(rest, orthogonalise([us[i] for i in rest], dtype=dtype, cast_back=cast_back,
                                        **kw) if rest else []):  # fmt: skip
        out[i] = o
    divisor = kw.pop("divisor")  # applied to the blocks before they travel (optim/sharded.py)
    kw = {**kw, "distributed": False}  # the owner's matrices: on the owner only
    results = sharded.orthogonalise_sharded(
        [us[i] for i in idx], lambda xs: orthogonalise(xs, dtype=dtype, **kw), dtype, divisor
    )
    for i, r in zip(idx, results):
        out[i] = r.to(us[i].dtype) if cast_back else r
    return out


def _same_shape(us: Tensors, merge_transposed: bool = False) -> dict[tuple, list[int]]:
    """Indices of ``us`` by (shape, dtype, device), each list in the order of ``us``.

    ``merge_transposed``: a tall matrix is orthogonalised as its transpose (as ``newton_schulz``
    does), so ``(m, n)`` and ``(n, m)`` share a batch (GPT-2's MLP matrices: one batch, not two).
    Only for the fused iteration: in float32 a contiguous transposed copy takes another GEMM
    layout than the transposed view, and may round differently in the last bit.
    """
    groups: dict[tuple, list[int]] = {}
    for i, u in enumerate(us):
        shape = tuple(u.shape)
        if merge_transposed and shape[-2] > shape[-1]:
            shape = (*shape[:-2], shape[-1], shape[-2])
        groups.setdefault((shape, u.dtype, u.device), []).append(i)
    return groups


def _scaled(x: torch.Tensor, divisor: float | None) -> torch.Tensor:
    return x if divisor is None else x / divisor


def _stack(xs: Tensors, dtype: torch.dtype, divisor: float | None, rows: int = 0):
    """``(max(rows, len(xs)), m, n)`` in ``dtype``: the (divided) matrices, then zero matrices.

    Written slice by slice so that no full-precision stack is made; ``x / divisor`` is rounded
    to ``dtype`` exactly as ``newton_schulz(x / divisor)`` rounds it.
    """
    out = torch.empty((max(rows, len(xs)), *xs[0].shape), dtype=dtype, device=xs[0].device)
    scaled = xs if divisor is None else torch._foreach_div(xs, divisor)
    torch._foreach_copy_(list(out[: len(xs)].unbind(0)), scaled)  # one op, not one per matrix
    if rows > len(xs):
        out[len(xs) :].zero_()
    return out


class Layout(NamedTuple):
    """Where a batch's results lie in the buffer every rank fills (``layout``)."""

    k: int  # slots a rank in the all-gather: rank r's first k matrices at [r * k, (r + 1) * k)
    order: list[int]  # the batch's matrix (its index in the batch) in each slot, in slot order
    extras: list[tuple[int, int]]  # (slot, owner) of each matrix broadcast from its owner


def layout(own: list[int], world: int) -> Layout:
    """A batch's collectives from its owners ``own`` (one rank a matrix, in batch order): the
    all-gather takes the ``k`` slots every rank fills (the fewest any rank owns; 0 where a
    rank owns none), each rank's first ``k`` matrices; the rest follow, rank by rank, each in a
    slot of its own broadcast from its owner. ``len(own)`` slots: none padded."""
    mine = [[j for j, o in enumerate(own) if o == r] for r in range(world)]
    k = min(len(m) for m in mine)
    order = [j for m in mine for j in m[:k]]
    rest = [j for m in mine for j in m[k:]]
    extras = [(len(order) + e, own[j]) for e, j in enumerate(rest)]
    return Layout(k, order + rest, extras)


def _split(xs, own, rank, world, steps, eps, dtype, divisor, batched, fused=False):
    """The matrices of ``xs`` that ``own`` gives this rank orthogonalised here, then every
    rank's moved to every rank (``layout``: one all-gather and a broadcast a matrix beyond it).
    Returns the results in the order of ``xs`` and the work handles."""
    shape, device = xs[0].shape, xs[0].device
    lay = layout(own, world)
    mine = [i for i, o in enumerate(own) if o == rank]
    res = torch.empty((len(mine), *shape), dtype=dtype, device=device)
    if mine and batched:
        res = newton_schulz(_stack([xs[i] for i in mine], dtype, divisor), steps, eps, dtype,
                            fused=fused)  # fmt: skip
    else:  # the per-matrix path
        for o, i in zip(res, mine):
            o.copy_(newton_schulz(_scaled(xs[i], divisor), steps, eps, dtype, fused=fused))
    gathered = torch.empty((len(xs), *shape), dtype=dtype, device=device)
    works = []
    if lay.k:
        works.append(_all_gather(gathered[: world * lay.k], res[: lay.k].contiguous()))
    at = {i: j for j, i in enumerate(mine)}  # a matrix's place in this rank's results
    for slot, owner in lay.extras:
        if owner == rank:
            gathered[slot].copy_(res[at[lay.order[slot]]])
        works.append(_broadcast(gathered[slot], owner))
    where = {i: slot for slot, i in enumerate(lay.order)}
    return [gathered[where[i]] for i in range(len(xs))], works


def assign(shapes: list[tuple[int, ...]], world: int, merged: bool = True) -> list[int]:
    """The owner rank of each matrix under the DDP split: by Newton-Schulz FLOPs, largest
    first to the least-loaded rank, no rank holding more than its share of a batch
    (optim/sharded.py ``owners``; ``merged``: a batch is a shape up to transposition, as the
    fused iteration and the engine's stacks on CUDA batch); a lone largest matrix on a rank of
    its own where that lowers the most FLOPs a rank computes; all 0 for one rank."""
    if world == 1:
        return [0] * len(shapes)
    return sharded.owners(shapes, world, merge=merged, isolate=True)


def rank_flops(shapes: list[tuple[int, ...]], world: int, steps: int = 5,
               merged: bool = True) -> list[int]:  # fmt: skip
    """Each rank's Newton-Schulz FLOPs a step under ``assign`` (what the split costs a rank)."""
    load = [0] * world
    for shape, r in zip(shapes, assign(shapes, world, merged)):
        load[r] += sharded.ns_flops(shape, steps)
    return load


def _all_gather(out: torch.Tensor, local: torch.Tensor):
    """Start gathering every rank's ``local`` into ``out``; returns the work handle to wait on."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(out, local, async_op=True)


def _broadcast(t: torch.Tensor, src: int):
    """Start broadcasting ``t`` from rank ``src`` (its owner) to every rank; the work handle."""
    return dist.broadcast(t, src, async_op=True)


def _batches(shapes: list[tuple[int, int]], merged: bool) -> list[tuple[tuple, list[int]]]:
    """(batch shape, indices) of ``shapes`` as ``orthogonalise`` batches them."""
    metas = [torch.empty(s, device="meta") for s in shapes]
    return [(key[0], idx) for key, idx in _same_shape(metas, merge_transposed=merged).items()]


def split_traffic(shapes: list[tuple[int, int]], world: int, *, merged: bool,
                  itemsize: int = 2) -> list[dict]:  # fmt: skip
    """The DDP split's collectives a step, from the assignment (no process needed), one dict a
    batch (per shape, or with ``merged`` per shape up to transposition, as the fused iteration
    and the engine's stacks batch): its ``shape``, ``n`` matrices, the all-gather's ``k`` slots
    a rank and the ``broadcasts`` beyond (``layout``), ``sent`` (the most a rank sends: its own
    results), ``results`` (every result's bytes), and ``padded_received`` (what the padded
    all-gather this replaced brought each rank: W times the fullest rank's slots, its owners
    without the lone matrix's rank of its own), in bytes of ``itemsize`` (bf16: 2)."""
    own, out = assign(shapes, world, merged), []
    before = _before(shapes, world, merged)
    for shape, idx in _batches(shapes, merged):
        counts = [sum(1 for i in idx if own[i] == r) for r in range(world)]
        fullest = max(sum(1 for i in idx if before[i] == r) for r in range(world))
        size = math.prod(shape) * itemsize
        lay = layout([own[i] for i in idx], world)
        out.append({"shape": shape, "n": len(idx), "k": lay.k, "broadcasts": len(lay.extras),
                    "sent": max(counts) * size, "results": len(idx) * size,
                    "padded_received": world * fullest * size})  # fmt: skip
    return out


def _before(shapes: list[tuple[int, int]], world: int, merged: bool) -> list[int]:
    """The owners before a lone largest matrix took a rank of its own (the padded layout's)."""
    return sharded.owners(shapes, world, merge=merged) if world > 1 else [0] * len(shapes)


def received_bytes(shapes: list[tuple[int, int]], world: int, *, merged: bool,
                   itemsize: int = 2) -> int:  # fmt: skip
    """The most bytes a rank receives a step: every result but its own (the all-gather's and
    the broadcasts' alike)."""
    own = assign(shapes, world, merged)
    per_rank = [0] * world
    for shape, idx in _batches(shapes, merged):
        size = math.prod(shape) * itemsize
        for r in range(world):
            per_rank[r] += sum(1 for i in idx if own[i] != r) * size
    return max(per_rank)


def ns_buffer_bytes(shapes: list[tuple[int, int]], world: int, *, merged: bool,
                    itemsize: int = 2, padded: bool = False) -> int:  # fmt: skip
    """Bytes of the buffers a rank holds for the engine's Newton-Schulz stacks
    (optim/engine/ns.py): per batch the stack the pre-pass writes (``n`` slots) and, split over
    ``world`` > 1 ranks, the results every rank receives (``n``) and its own all-gathered slots
    (``k``), in the NS dtype. ``padded``: the layout this replaced (W x the fullest rank's
    slots twice, and those slots)."""
    own = _before(shapes, world, merged) if padded else assign(shapes, world, merged)
    total = 0
    for shape, idx in _batches(shapes, merged):
        size, n = math.prod(shape) * itemsize, len(idx)
        if world == 1:
            total += n * size
            continue
        counts = [sum(1 for i in idx if own[i] == r) for r in range(world)]
        if padded:
            total += (2 * world * max(counts) + max(counts)) * size
        else:
            total += (2 * n + layout([own[i] for i in idx], world).k) * size
    return total
