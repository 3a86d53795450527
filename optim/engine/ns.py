"""Newton-Schulz buckets on the engine: persistent stacks, batched NS, one update pass per stack.

For a bucket whose preconditioner is ``newton-schulz`` (Muon, Moonlight, MARS-M,
MARS-M-Efficient, MARS-Shampoo's matrices), one step is:

1. the pre-pass (``step_kernel`` with ``DIRECTION=NS_OUT``): correction, clip, reference copy and
   momentum as every other bucket, then ``u`` (divided by ``1 - beta1`` with ``ns_debias``) is
   written straight into its slice of a persistent stack, ``(k, rows, cols)`` in the
   Newton-Schulz dtype (bf16 by default): no stacking copy, no cast;
2. ``newton_schulz`` on each stack (optim/functional.py: the batched iteration, ``ns_fused`` as
   the group says), the same call the foreach path's ``orthogonalise`` makes per batch;
3. ``apply_kernel`` per stack: ``p = p * (1 - lr * wd) - lr * scale(shape) * O``, reading each
   result where NS left it, the scale of the matrix's own shape.

The stacks are batched as ``orthogonalise`` batches (optim/newton_schulz.py ``_same_shape``):
with the fused iteration (``ns_fused``, on CUDA by default) a tall ``(m, n)`` shares the stack of
its transpose ``(n, m)`` (GPT-2's MLP matrices: one stack, not two), the pre-pass writing its
``u`` transposed into its slice (the table row's ``C_TCOLS``; its blocks are tiles, read along
rows and written along columns, both coalesced: optim/engine/kernels.py) and the update reading
the result back transposed, by tiles too; otherwise one stack per exact shape, a tall one's
result left transposed by NS (``newton_schulz`` iterates on ``u^T``) and read so. Either way the
stack NS runs on holds what the foreach path's batch holds, in the same layout. (On an H200 the
merged stacks took GPT-2 small's Muon step from 5.14 to 4.68 ms: docs/optim-engine.md.)

The stacks are allocated once per set of matrices (cached as plans are, optim/engine/tables.py)
and kept; under a device skip flag the pre-pass writes nothing, NS runs on the last step's stack
and the update pass writes nothing. The per-matrix reference (``ns_batched=False``) stays on the
eager path (optim/engine/rules.py).

Split over DDP ranks (``ns_distributed`` with a world of W > 1; every rank holds the same
averaged gradients): every rank runs the pre-pass over every matrix (element-wise, cheap), each
matrix has an owner by Newton-Schulz FLOPs (optim/newton_schulz.py ``assign``, the foreach
path's), and a stack of ``n`` matrices holds rank r's in the consecutive slots
``[start_r, start_r + count_r)`` (no slot padded); each rank orthogonalises its own slots only,
and the results move as the foreach path's (optim/newton_schulz.py ``layout``, in the NS dtype,
started before the next stack's NS): one all-gather of the ``k`` slots every rank fills, a
broadcast from its owner of each matrix beyond them, into the ``n`` slots of the buffer the
update pass reads. Every rank then applies every matrix's result, bit for bit the same bytes on
every rank.

On FSDP2 shards (a rank holds row blocks only) the stacks are the owners' instead
(optim/engine/ns_shards.py): the pre-pass writes each local block into a send buffer, the blocks
travel to their owners and back by all-to-all, and the update pass reads the rows that return.
"""

from __future__ import annotations

import torch

from optim.engine import layout as L
from optim.engine import ns_shards
from optim.engine.loader import tl_dtype, warps
from optim.engine.ns_shards import ShardStack, ShardStacks
from optim.engine.rules import ns_dtype
from optim.engine.tables import Plan, PlanCache, key
from optim.functional import newton_schulz
from optim.newton_schulz import assign, layout, split_world


class Stack:
    """One persistent stack ``(rows, a, b)`` and the update pass's plan over its matrices.

    ``flip``: NS leaves the result transposed (a tall stack: ``(rows, b, a)`` in memory);
    ``read``: the matrix shape of the result as it lies in memory; a matrix of that shape is
    read straight, one of its transpose read transposed (the plan's ``C_TCOLS``).
    ``params``: the matrix of each slot of the results the update pass reads (one rank: the
    stack's slots). Split over ranks (``world`` > 1): this rank's matrices lie in the stack's
    slots ``[start, start + count)``; it orthogonalises them, puts its first ``k`` into
    ``local`` for the all-gather into ``gathered[: world * k]``, and each of its matrices
    beyond them (``extras``: ``(slot, owner, its place among this rank's)``) into its slot of
    ``gathered``, broadcast from there (optim/newton_schulz.py ``layout``)."""

    def __init__(self, stack: torch.Tensor, params: list, block: int, share=(0, 0, 1, 0),
                 k: int = 0, extras: list | None = None) -> None:  # fmt: skip
        a, b = stack.shape[1:]
        self.stack, self.flip = stack, a > b
        self.read = (b, a) if self.flip else (a, b)
        tcols = [0 if tuple(p.shape) == self.read else p.shape[1] for p in params]
        self.plan = Plan({L.C_P: list(params)}, block, tcols=tcols)
        self.start, self.count, self.world, self.rank = share
        self.k, self.extras = k, extras or []
        if self.world > 1:
            self.local = stack.new_zeros((k, *self.read))
            self.gathered = stack.new_zeros((stack.shape[0], *self.read))


class Stacks:
    """A Newton-Schulz bucket's persistent stacks, one per shape, or with ``merge`` one per
    shape up to transposition (a tall matrix in its transpose's stack, written transposed);
    kept per set of parameters (not per gradient tensors). ``(rank, world)``: split over DDP
    ranks, each matrix's owner by optim/newton_schulz.py ``assign`` (as the foreach path's)."""

    def __init__(self, params: list, dtype: torch.dtype, block: int, merge: bool,
                 rank: int = 0, world: int = 1) -> None:  # fmt: skip
        by_shape: dict[tuple, list[int]] = {}
        for i, p in enumerate(params):
            m, n = p.shape
            by_shape.setdefault((n, m) if merge and m > n else (m, n), []).append(i)
        own = assign([tuple(p.shape) for p in params], world, merged=merge)
        self.out: list = [None] * len(params)  # each matrix's slice of its stack
        self.tcols = [0] * len(params)  # the pre-pass's C_TCOLS: its columns where transposed
        self.stacks: list[Stack] = []
        for shape, idx in by_shape.items():
            slots = [[i for i in idx if own[i] == r] for r in range(world)]
            rows = [i for mine in slots for i in mine]  # the stack: each rank's consecutive
            stack = torch.zeros((len(rows), *shape), dtype=dtype, device=params[0].device)
            for j, i in enumerate(rows):
                self.out[i] = stack[j]
                if tuple(params[i].shape) != shape:
                    self.tcols[i] = params[i].shape[1]
            start = sum(len(mine) for mine in slots[:rank])
            share, k, extras, results = (start, len(slots[rank]), world, rank), 0, [], rows
            if world > 1:  # the results' slots: the all-gather's, then one a broadcast
                lay = layout([own[i] for i in idx], world)
                results = [idx[j] for j in lay.order]
                place = {i: j for j, i in enumerate(slots[rank])}
                k = lay.k
                extras = [(slot, owner, place.get(results[slot])) for slot, owner in lay.extras]
            self.stacks.append(Stack(stack, [params[i] for i in results], block, share, k,
                                     extras))  # fmt: skip
        self.dtype = dtype


def merged(b, device: torch.device) -> bool:
    """Whether NS runs fused (``ns_fused``; None: on CUDA), so that a tall shape shares its
    transpose's stack (as ``orthogonalise`` merges them only then)."""
    fused = b.preconditioner.fused
    return fused if fused is not None else device.type == "cuda"


def plan(b, cols: dict, cache: PlanCache, block: int) -> tuple[Plan, Stacks | ShardStacks]:
    """The pre-pass's plan (the stacks' slices in its ``C_OUT`` column) and the stacks; FSDP2
    shards (every tensor of a Newton-Schulz launch: optim/engine/launch.py ``by_step``): the
    owners' stacks (optim/engine/ns_shards.py)."""
    dtype, params = ns_dtype(b), cols[L.C_P]
    if b.shards and b.shards[0] is not None:
        merge, world = False, -1  # (a key of its own)
        stacks = cache.get(key({L.C_P: params}, block, ("ns-shards", dtype)),
                           lambda: ShardStacks(params, b.shards, dtype, block))  # fmt: skip
    else:
        merge = merged(b, params[0].device)
        rank, world = split_world(b.preconditioner.distributed)
        stacks = cache.get(key({L.C_P: params}, block, ("ns-stacks", dtype, merge, rank, world)),
                           lambda: Stacks(params, dtype, block, merge, rank, world))  # fmt: skip
    cols = {**cols, L.C_OUT: stacks.out}
    norm = b.view.get("variance_reduction", False) and b.view.get("clip") == "tensor"
    return cache.get(key(cols, block, ("ns", norm, merge, world)),
                     lambda: Plan(cols, block, norm=norm, tcols=stacks.tcols)), stacks  # fmt: skip


def run(go, k, ln, divisors, flag, update) -> None:
    """The pre-pass (``update``: optim/engine/launch.py), NS per stack (split: this rank's
    slots, then one all-gather per stack, each started before the next stack's NS), the
    update per stack (``go``: launch, or with ``go.dry`` compile only: NS is then not
    computed and nothing is gathered)."""
    plan, stacks, pre = ln.plan, ln.stacks, ln.b.preconditioner
    if plan.nblocks:
        update(go, k, ln, divisors, flag, out_dtype=stacks.dtype)
    if isinstance(stacks, ShardStacks):
        ns_shards.run(go, ln, pre, lambda s, base: _apply(go, k, ln, s, base, flag))
        return
    fused = merged(ln.b, plan.table.device)
    results = []
    for s in stacks.stacks:
        if not s.plan.nblocks:
            continue
        if s.world > 1:
            results.append((s, *_split(go, s, pre, stacks.dtype, fused)))
            continue
        if go.dry:  # the layout NS leaves a tall stack's result in, without computing it
            res = s.stack.mT.contiguous().mT if s.flip else s.stack
        else:
            res = newton_schulz(s.stack, pre.steps, pre.eps, stacks.dtype, fused=fused)
        base = res.mT if s.flip else res
        results.append((s, base if base.is_contiguous() else base.contiguous(), []))
    for s, base, works in results:
        for work in works:
            if work is not None:  # (a test's stand-in collective returns none)
                work.wait()  # (NCCL: orders the streams, not the host)
        _apply(go, k, ln, s, base, flag)


def _split(go, s: Stack, pre, dtype: torch.dtype, fused: bool) -> tuple:
    """This rank's slots of stack ``s`` orthogonalised, its first ``k`` into ``s.local`` and
    the rest into their slots of ``s.gathered``; then the all-gather into ``s.gathered`` and a
    broadcast a matrix beyond it (the works returned: waited on before the update)."""
    if go.dry:
        return s.gathered, []
    if s.count:
        res = newton_schulz(s.stack[s.start : s.start + s.count], pre.steps, pre.eps, dtype,
                            fused=fused)  # fmt: skip
        res = res.mT if s.flip else res  # the layout the update reads
        if s.k:
            s.local.copy_(res[: s.k])
        for slot, owner, j in s.extras:
            if owner == s.rank:
                s.gathered[slot].copy_(res[j])
    works = [gather_ns(s.gathered[: s.world * s.k], s.local)] if s.k else []
    works += [broadcast_ns(s.gathered[slot], owner) for slot, owner, _ in s.extras]
    return s.gathered, works


def _apply(go, k, ln, s: Stack | ShardStack, base: torch.Tensor, flag) -> None:
    """``p = p * (1 - lr * wd) - lr * scale(shape) * O`` over stack ``s``'s matrices."""
    view, pre, sub = ln.b.view, ln.b.preconditioner, s.plan
    lr, keep = view["lr"], 1 - view["lr"] * view["weight_decay"]
    shape = s.shape if isinstance(s, ShardStack) else s.read  # (a shard's: global, read straight)
    other = shape[::-1]
    go(
        k.apply_kernel, (sub.nblocks,), sub.table, sub.blocks, base,
        sub.blocks if flag is None else flag, keep, -(lr * pre.scale(shape)),
        -(lr * pre.scale(other)), DT=tl_dtype(ln.dtype), SRC_DT=tl_dtype(s.stack.dtype),
        BLOCK=sub.block, STRIDED=sub.strided, HAS_SKIP=flag is not None, ALIGNED=sub.aligned,
        TILE=L.tile_rows(sub.block), num_warps=warps(sub.block),
    )  # fmt: skip


def broadcast_ns(t: torch.Tensor, src: int):
    """Start broadcasting ``t`` from its owner ``src`` (optim/newton_schulz.py's broadcast: a
    test counts it); the work handle."""
    from optim import newton_schulz as ns

    return ns._broadcast(t, src)


def gather_ns(out: torch.Tensor, local: torch.Tensor):
    """Start every rank's ``local`` gathering into ``out`` (optim/newton_schulz.py's gather:
    a test counts it); the work handle."""
    from optim import newton_schulz as ns

    return ns._all_gather(out, local)
