"""The engine's launches for one step of the core: norm passes, their finish, the update passes.

``step(items, ...)`` takes the buckets the engine covers (each with its ``Kind``) and runs, all on
the device and without a host read:

1. for each bucket clipped per tensor: ``norm_kernel`` (a partial sum of ``c*c`` per block) and
   ``finish_tensor_kernel`` (per tensor ``1 / max(1, ||c||)``); for the buckets clipped
   ``global``: their norm passes into one buffer and one ``finish_global_kernel``
   (``max(1, ||c||)`` over all of them, as the foreach path's ``clip_unit_norm_``);
2. for each bucket ``step_kernel``: correction, clip, reference copy, momentum, direction,
   decay and step in one pass (Newton-Schulz buckets: its pre-pass, NS on the stacks, then
   ``apply_kernel`` per stack; optim/engine/ns.py).

Tensors at different step counts (a parameter without a gradient on some steps) are launched
apart, one launch per count; usually there is one. ``gscale`` (the trainer's global gradient
clip folded into the step, optim/engine/clip.py): a 0-d device tensor every kernel that reads a
gradient multiplies it by on load.

FSDP2 shards (a bucket's local blocks): the clips' per-block sums are finished after one
all-reduce of the per-tensor sums (and the global clip's) over the shards' group a step
(``_finish_sharded``), not by the finish kernels.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from optim import sharded
from optim.engine import layout as L
from optim.engine import ns as ns_pass
from optim.engine.loader import Go, tl_dtype, warps
from optim.engine.rules import Kind, scalars
from optim.engine.tables import Plan, PlanCache, key, to_device

# Elements per program of every engine kernel (tests set a small one). CUDA's is picked by
# occupancy until records decide (bench/occupancy.py, sm_90 compiled on a CPU): MARS-AdamW's
# update, loads before stores, takes 156 registers a thread at 4096 / 8 warps (1 CTA per SM),
# 80 at 2048 / 8 warps (3), 72 at 1024 / 4 warps (7); tests/test_engine_block.py keeps the
# default at 2 CTAs per SM or more. ``OPTIM_ENGINE_BLOCK`` (or ``set_block``) chooses another:
# the GPU check times 4096, 2048 and 1024 (bench.optim_fused --block).
DEFAULT_BLOCK = 2048
BLOCK_CHOICES = (256, 512, 1024, 2048, 4096, 8192)


def check_block(n: int | str) -> int:
    """``n`` as a block size, or a ValueError that lists the choices."""
    try:
        block = int(n)
    except (TypeError, ValueError):
        block = -1
    if block not in BLOCK_CHOICES:
        raise ValueError(f"engine block size {n!r}: one of {', '.join(map(str, BLOCK_CHOICES))}")
    return block


def set_block(n: int, device_type: str = "cuda") -> None:
    """Every engine kernel launched after this on ``device_type`` at ``n`` elements a program
    (its warps: optim/engine/loader.py ``warps``); a kept launch list keeps its plan's size."""
    BLOCKS[device_type] = check_block(n)


BLOCKS = {"cuda": check_block(os.environ.get("OPTIM_ENGINE_BLOCK", DEFAULT_BLOCK)), "cpu": 1024}
CHUNK = {"cuda": 1024, "cpu": 64}  # partial sums read at a time by a finish program


def columns(b, kind: Kind) -> dict[int, list]:
    """The tensors of bucket ``b`` that ``kind``'s kernel reads or writes, by table column."""
    states = b.states
    cols = {L.C_P: b.params, L.C_G: b.gs, L.C_M: [s[b.momentum.key] for s in states]}
    if kind.reduce:
        cols[L.C_REF] = [s["last_grad"] for s in states]
    held = L.STATE[kind.direction]  # the direction's state (p always: NS's update reads it)
    if L.C_V in held:
        cols[L.C_V] = [s["exp_avg_sq"] for s in states]
    if kind.amsgrad:
        cols[L.C_X] = [s["max_exp_avg_sq"] for s in states]
    if L.C_X in held:  # AdEMAMix's slow EMA
        cols[L.C_X] = [s["exp_avg_slow"] for s in states]
    return cols


def by_step(b, kind: Kind) -> list[tuple[int, list[int]]]:
    """``(step count, indices)`` of ``b``'s tensors; Newton-Schulz's scalars do not depend on
    the count: one group."""
    counts = [s["step"] for s in b.states]
    if kind.direction == L.NS_OUT:
        return [(counts[0], list(range(len(counts))))]
    groups: dict[int, list[int]] = {}
    for i, t in enumerate(counts):
        groups.setdefault(t, []).append(i)
    return list(groups.items())


class Launch:
    """One launch group: a bucket's tensors at one step count, with its plan."""

    def __init__(self, b, kind: Kind, t: int, idx: list[int], cache: PlanCache, block: int,
                 gscale: torch.Tensor | None = None, sums=None):  # fmt: skip
        self.b, self.kind, self.t, self.gscale, self.sums = b, kind, t, gscale, sums
        self.idx = idx  # the bucket's tensors of this launch, in the plan's row order
        self.rows = None  # (the fold's index, each row's merged row there): ``_merged``
        # FSDP2: the local blocks' norms are all-reduced over the shards' group (``_finish``)
        self.group = sharded.group_of(b.shards) if b.shards and b.shards[0] is not None else None
        self.first = idx[0]  # a tensor of this count: where a kept launch reads the next one
        cols = {c: [ts[i] for i in idx] for c, ts in columns(b, kind).items()}
        self.dtype = cols[L.C_P][0].dtype
        self.stacks = None
        if kind.direction == L.NS_OUT:
            self.plan, self.stacks = ns_pass.plan(b, cols, cache, block)
        else:
            norm = kind.clip == L.CLIP_TENSOR
            self.plan = cache.get(key(cols, block, (norm,)), lambda: Plan(cols, block, norm=norm))

    def variant(self, skip: bool) -> tuple:
        """What the compiled kernels of this launch depend on beyond the tensors' addresses."""
        stacks = self.stacks.stacks if self.stacks else []
        subs = [(s.plan.aligned, s.plan.strided) for s in stacks] + [self.plan.strided]
        first = self.kind.direction == L.SOAP_ADAM and self.t == 1
        folded = self.gscale is not None
        merged = self.sums is not None
        return self.kind, self.dtype, skip, first, self.plan.aligned, tuple(subs), folded, merged


GO = Go(dry=False)


class CompileFailed(RuntimeError):
    """A kernel of the step did not compile; nothing was written."""


def step(items: list[tuple], skip: torch.Tensor | None, k, cache: PlanCache,
         device_type: str, compiled: set, gscale: torch.Tensor | None = None,
         sums=None) -> list[Launch]:  # fmt: skip
    """Run the covered buckets ``items`` (``(bucket, kind)`` pairs) through the kernels ``k``.
    A kernel variant not in ``compiled`` is compiled first, all of the step's before any runs
    (``CompileFailed``: every tensor is as it was), and added to it. ``gscale``: the folded
    global clip's factor (module docstring), or None; ``sums``: its norm pass's sums merged
    with MARS's (optim/engine/clip.py ``Sums``), or None. Returns the launches (kept by
    optim/engine/steady.py for the next steps: ``run``)."""
    block, chunk = BLOCKS[device_type], CHUNK[device_type]
    launches = [Launch(b, kind, t, idx, cache, block, gscale, sums)
                for b, kind in items for t, idx in by_step(b, kind)]  # fmt: skip
    new = {ln.variant(skip is not None) for ln in launches} - compiled
    if new:
        try:
            _run(launches, skip, k, cache, chunk, Go(dry=True))
        except Exception as e:
            raise CompileFailed(f"{type(e).__name__}: {e}") from e
        compiled |= new
    _run(launches, skip, k, cache, chunk, Go(dry=False))
    return launches


def run(launches: list[Launch], skip: torch.Tensor | None, k, cache: PlanCache,
        device_type: str) -> None:  # fmt: skip
    """Run kept launches (their variants compiled by the step that built them)."""
    _run(launches, skip, k, cache, CHUNK[device_type], GO)


def _run(launches: list[Launch], skip, k, cache: PlanCache, chunk: int, go: Go) -> None:
    flag = None if skip is None else skip.view(torch.uint8)
    merged = {id(ln) for ln in launches if _merged(ln) is not None}
    for ln in launches:
        if ln.kind.clip == L.CLIP_TENSOR and id(ln) in merged:  # the fold's sums: no norm pass
            _merged_finish(go, k, ln, ln.plan.divisors, False, chunk)
        elif ln.kind.clip == L.CLIP_TENSOR and ln.plan.nblocks:
            _norm(go, k, ln, ln.plan.partial)
            if ln.group is None:  # (sharded: finished after the all-reduce, below)
                go(k.finish_tensor_kernel, (ln.plan.n,), ln.plan.table, ln.plan.partial,
                   ln.plan.divisors, CHUNK=chunk)  # fmt: skip
    glob = [ln for ln in launches if ln.kind.clip == L.CLIP_GLOBAL]
    if glob and all(id(ln) in merged for ln in glob):  # (whole-tensor sums: no all-reduce)
        total, shards = _global_merged(go, k, glob, cache, chunk), False
    else:
        merged -= {id(ln) for ln in glob}
        shards = bool(glob) and glob[0].group is not None  # (all sharded or none: dispatch.py)
        total = _global_clip(go, k, glob, cache, chunk, finish=not shards)
    if not go.dry:
        _finish_sharded([ln for ln in launches if ln.group is not None and id(ln) not in merged
                         and ln.kind.clip == L.CLIP_TENSOR], glob if shards else [], cache)  # fmt: skip
    for ln in launches:
        divisors = total if ln.kind.clip == L.CLIP_GLOBAL else ln.plan.divisors
        if ln.kind.direction == L.NS_OUT:
            ns_pass.run(go, k, ln, divisors, flag, _update)
        elif ln.plan.nblocks:
            _update(go, k, ln, divisors, flag)


def _norm(go: Go, k, ln: Launch, partial: torch.Tensor) -> None:
    sc = scalars(ln.b, ln.kind, ln.t)
    go(k.norm_kernel, (ln.plan.nblocks,), ln.plan.table, ln.plan.blocks, partial, sc.kappa,
       _or(ln.gscale, partial), DT=tl_dtype(ln.dtype), ACC=tl_dtype(ln.dtype),
       BLOCK=ln.plan.block, ALIGNED=ln.plan.aligned, REDUCE=True, GSCALE=ln.gscale is not None,
       num_warps=warps(ln.plan.block))  # fmt: skip


def _merged(ln: Launch) -> torch.Tensor | None:
    """Each plan row's row in the fold's merged sums (``ln.sums``),
    where every tensor of the launch has one; else None (its own norm pass). Decided by the
    tensors' state dicts, the same on every rank (FSDP2: the clips' all-reduce depends on it);
    kept on the launch per fold index. Newton-Schulz's pre-pass keeps its own norm pass (its
    plan's rows follow the stacks' slots)."""
    sums = ln.sums
    if sums is None or ln.kind.direction == L.NS_OUT or not ln.kind.reduce:
        return None
    if ln.rows is not None and ln.rows[0] is sums.index:
        return ln.rows[1]
    rows = tuple(sums.index.get(id(ln.b.owners[i])) for i in ln.idx)
    found = None
    if all(r is not None for r in rows):  # (FSDP2: a rank's empty block has its whole sums)
        # kept on the plan (the plan cache's: it outlives a step's launches and folds, which new
        # gradient buffers rebuild), copied to the device without a host sync (pinned, async;
        # the host copy kept alive with it)
        kept = ln.plan.__dict__.setdefault("merged_rows", {})
        if rows not in kept:
            kept[rows] = to_device(torch.tensor(rows, dtype=torch.int64), ln.plan.table.device)
        found = kept[rows][0]
    ln.rows = (sums.index, found)
    return found


def _merged_finish(go: Go, k, ln: Launch, out: torch.Tensor, glob: bool, chunk: int) -> None:
    """The launch's clip from the fold's merged sums (``merged_finish_kernel``): per tensor
    ``1 / max(1, ||c||)``, or ``||c||^2`` into ``out`` (``glob``: the global clip's buffer)."""
    sums = ln.sums
    sc = scalars(ln.b, ln.kind, ln.t)
    go(k.merged_finish_kernel, (ln.plan.n,), sums.table, sums.partial, sums.stride,
       _merged(ln), sums.coef, sc.kappa, out, SUMMED=sums.summed, GLOBAL=glob,
       CHUNK=chunk)  # fmt: skip


def _global_merged(go: Go, k, launches: list[Launch], cache: PlanCache, chunk: int):
    """The global clip from the fold's merged sums: each tensor's ``||c||^2`` into one buffer
    (a slot per tensor), one ``finish_global_kernel`` over it."""
    sizes = [ln.plan.n for ln in launches]
    first = launches[0]
    device = first.plan.table.device
    ident = ("global-merged", tuple(sizes), first.dtype, device)
    buf = cache.get(ident, lambda: _GlobalBuffer(sizes, first.dtype, device))
    for ln, part in zip(launches, buf.parts):
        _merged_finish(go, k, ln, part, True, chunk)
    go(k.finish_global_kernel, (1,), buf.partial, buf.count, buf.divisors, CHUNK=chunk)
    return buf.divisors


def _or(tensor: torch.Tensor | None, dummy: torch.Tensor) -> torch.Tensor:
    """A pointer argument the kernel does not read unless told (``dummy`` where None)."""
    return dummy if tensor is None else tensor


def _global_clip(go: Go, k, launches: list[Launch], cache: PlanCache, chunk: int,
                 finish: bool = True):  # fmt: skip
    """One ``max(1, ||c||)`` over every tensor of ``launches``: their norm passes write into one
    buffer (cached by the plans it spans), one program sums it (``finish``; sharded: the sum is
    all-reduced first, ``_finish_sharded``)."""
    if not launches:
        return None
    buf = _global_buffer(launches, cache)
    for ln, part in zip(launches, buf.parts):
        if ln.plan.nblocks:
            _norm(go, k, ln, part)
    if finish:
        go(k.finish_global_kernel, (1,), buf.partial, buf.count, buf.divisors, CHUNK=chunk)
    return buf.divisors


def _global_buffer(launches: list[Launch], cache: PlanCache) -> _GlobalBuffer:
    sizes = [ln.plan.nblocks for ln in launches]
    first = launches[0]
    device = first.plan.table.device
    ident = ("global", tuple(sizes), first.dtype, device)  # the buffer depends on these only
    return cache.get(ident, lambda: _GlobalBuffer(sizes, first.dtype, device))


def _finish_sharded(tensor: list[Launch], glob: list[Launch], cache: PlanCache) -> None:
    """The clips of FSDP2 shards: each tensor's sum of ``c*c`` over its local blocks (per
    tensor, and the global clip's one sum) all-reduced over the shards' group in one call, then
    ``1 / max(1, ||c||)`` per tensor and ``max(1, ||c||)`` for the global clip, as the finish
    kernels compute them. A few small device ops; no host read."""
    if not tensor and not glob:
        return
    sums = [_tensor_sums(ln) for ln in tensor]
    buf = _global_buffer(glob, cache) if glob else None
    if buf is not None:
        sums.append(buf.partial[: buf.count].sum().reshape(1))
    flat = torch.cat(sums)
    dist.all_reduce(flat, group=(tensor or glob)[0].group)
    at = 0
    for ln in tensor:
        n = ln.plan.n
        ln.plan.divisors[:n].copy_(flat[at : at + n].sqrt().clamp_min(1.0).reciprocal())
        at += n
    if buf is not None:
        buf.divisors.copy_(flat[at:].sqrt().clamp_min(1.0))


def _tensor_sums(ln: Launch) -> torch.Tensor:
    """Per tensor of the launch, the sum of its blocks' partial sums (0 for an empty block)."""
    plan = ln.plan
    which = getattr(plan, "which", None)
    if which is None:  # each program's tensor, kept on the plan (a device copy, once)
        which = plan.which = plan.blocks[:, 0].long()
    sums = torch.zeros(plan.n, dtype=plan.partial.dtype, device=plan.partial.device)
    return sums.index_add_(0, which, plan.partial[: plan.nblocks])


class _GlobalBuffer:
    """The partial sums of a global clip's norm passes, one slice per launch."""

    def __init__(self, sizes: list[int], dtype: torch.dtype, device: torch.device) -> None:
        self.count = sum(sizes)
        self.partial = torch.empty(max(sum(sizes), 1), dtype=dtype, device=device)
        self.divisors = torch.empty(1, dtype=dtype, device=device)
        offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        self.parts = [self.partial[o : o + n] for o, n in zip(offsets, sizes)]


def _update(go: Go, k, ln: Launch, divisors, flag, out_dtype: torch.dtype | None = None) -> None:
    kind, plan = ln.kind, ln.plan
    first = kind.direction == L.SOAP_ADAM and ln.t == 1
    go(
        k.step_kernel, (plan.nblocks,), plan.table, plan.blocks, _or(divisors, plan.table),
        _or(flag, plan.blocks), _or(ln.gscale, plan.table), *scalars(ln.b, kind, ln.t).args(),
        DT=tl_dtype(ln.dtype), OUT_DT=tl_dtype(out_dtype or ln.dtype), BLOCK=plan.block,
        REDUCE=kind.reduce, CLIP=kind.clip, COPY_REF=kind.copy_ref, MOMENTUM=kind.momentum,
        DIRECTION=kind.direction, AMSGRAD=kind.amsgrad, SRC_C=kind.src_c, FIRST=first,
        HAS_SKIP=flag is not None, ALIGNED=plan.aligned, GSCALE=ln.gscale is not None,
        STRIDED=plan.strided, TILE=L.tile_rows(plan.block), num_warps=warps(plan.block),
    )  # fmt: skip
