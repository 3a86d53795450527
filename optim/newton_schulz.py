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
  optim/sharded.py ``owners``, largest first to the least-loaded rank, the same on every rank),
  so a lone large matrix (a tied embedding) no longer lands on rank 0 beside its share of every
  shape. Per shape, each rank orthogonalises the matrices it owns (one batched call) into its
  block of ``k`` slots (``k``: the most any rank owns of that shape; empty slots are zeros, not
  computed), and one all-gather per shape gives every rank every result, bit for bit the same
  on all ranks. Every rank takes part in each collective; the gathers are asynchronous (each
  overlaps the next shape's work; all are waited on before returning: on NCCL a wait orders the
  streams, not the host), and there is no other host synchronisation. Gathered in the
  Newton-Schulz dtype (bf16: half the bytes; casting to the parameter dtype afterwards is exact
  either way). ``rank_flops`` gives each rank's FLOPs a step from the assignment.

As Keller Jordan's and the MARS repo's Muon, which split the matrices over ranks the same way;
Moonlight and the official MARS-M compute every matrix on every rank (``distributed=False``).
"""

from __future__ import annotations

import math

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
        if work is not None:
            work.wait()
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


def _split(xs, own, rank, world, steps, eps, dtype, divisor, batched, fused=False):
    """The matrices of ``xs`` that ``own`` gives this rank orthogonalised here, then every
    rank's all-gathered (module docstring): rank r's j-th owned matrix lies in slot
    ``r * k + j`` of the gather. Returns the results in the order of ``xs`` and the work."""
    shape, device = xs[0].shape, xs[0].device
    slots = [[i for i, o in enumerate(own) if o == r] for r in range(world)]
    k = max(len(s) for s in slots)
    mine = [xs[i] for i in slots[rank]]
    if mine and batched and len(mine) == k:  # a full block: gathered as NS returns it
        local = newton_schulz(_stack(mine, dtype, divisor), steps, eps, dtype, fused=fused)
    else:  # this rank's empty slots gather as zeros; nothing computed for them
        local = torch.zeros((k, *shape), dtype=dtype, device=device)
        if mine and batched:
            local[: len(mine)] = newton_schulz(_stack(mine, dtype, divisor), steps, eps, dtype,
                                               fused=fused)  # fmt: skip
        else:  # the per-matrix path
            for o, x in zip(local, mine):
                o.copy_(newton_schulz(_scaled(x, divisor), steps, eps, dtype, fused=fused))
    gathered = torch.empty((world * k, *shape), dtype=dtype, device=device)
    work = _all_gather(gathered, local.contiguous())
    where = {i: r * k + j for r, s in enumerate(slots) for j, i in enumerate(s)}
    return [gathered[where[i]] for i in range(len(xs))], work


def assign(shapes: list[tuple[int, ...]], world: int, merged: bool = True) -> list[int]:
    """The owner rank of each matrix under the DDP split: by Newton-Schulz FLOPs, largest
    first to the least-loaded rank, no rank holding more than its share of a batch
    (optim/sharded.py ``owners``; ``merged``: a batch is a shape up to transposition, as the
    fused iteration and the engine's stacks on CUDA batch); all 0 for one rank."""
    return sharded.owners(shapes, world, merge=merged) if world > 1 else [0] * len(shapes)


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


def split_traffic(shapes: list[tuple[int, int]], world: int, *, merged: bool,
                  itemsize: int = 2) -> list[dict]:  # fmt: skip
    """The DDP split's collectives a step, from the assignment (no process needed): one
    all-gather per batch (per shape, or with ``merged`` per shape up to transposition, as the
    fused iteration and the engine's stacks batch), each rank sending its ``k`` slots of
    ``rows * cols`` elements of ``itemsize`` bytes (bf16: 2) and receiving ``world`` times that.
    One dict per all-gather: its shape, ``k``, ``sent`` and ``received`` bytes per rank."""
    own, out = assign(shapes, world, merged), []
    for (shape, _, _), idx in _same_shape([torch.empty(s, device="meta") for s in shapes],
                                          merge_transposed=merged).items():  # fmt: skip
        k = max(sum(1 for i in idx if own[i] == r) for r in range(world))
        sent = k * math.prod(shape) * itemsize
        out.append({"shape": shape, "k": k, "sent": sent, "received": world * sent})
    return out
