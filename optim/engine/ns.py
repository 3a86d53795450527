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
and the update pass writes nothing. Split over DDP ranks (``ns_distributed`` with a world above
1) and the per-matrix reference (``ns_batched=False``) stay on the eager path
(optim/engine/rules.py).
"""

from __future__ import annotations

import torch

from optim.engine import layout as L
from optim.engine.loader import tl_dtype, warps
from optim.engine.rules import ns_dtype
from optim.engine.tables import Plan, PlanCache, key
from optim.functional import newton_schulz


class Stack:
    """One persistent stack ``(k, a, b)`` and the update pass's plan over its matrices.

    ``flip``: NS leaves the result transposed (a tall stack: ``(k, b, a)`` in memory);
    ``read``: the matrix shape of the result as it lies in memory; a matrix of that shape is
    read straight, one of its transpose read transposed (the plan's ``C_TCOLS``)."""

    def __init__(self, stack: torch.Tensor, params: list, block: int) -> None:
        a, b = stack.shape[1:]
        self.stack, self.flip = stack, a > b
        self.read = (b, a) if self.flip else (a, b)
        tcols = [0 if tuple(p.shape) == self.read else p.shape[1] for p in params]
        self.plan = Plan({L.C_P: params}, block, tcols=tcols)


class Stacks:
    """A Newton-Schulz bucket's persistent stacks, one per shape, or with ``merge`` one per
    shape up to transposition (a tall matrix in its transpose's stack, written transposed);
    kept per set of parameters (not per gradient tensors)."""

    def __init__(self, params: list, dtype: torch.dtype, block: int, merge: bool) -> None:
        by_shape: dict[tuple, list[int]] = {}
        for i, p in enumerate(params):
            m, n = p.shape
            by_shape.setdefault((n, m) if merge and m > n else (m, n), []).append(i)
        self.out: list = [None] * len(params)  # each matrix's slice of its stack
        self.tcols = [0] * len(params)  # the pre-pass's C_TCOLS: its columns where transposed
        self.stacks: list[Stack] = []
        for shape, idx in by_shape.items():
            stack = torch.zeros((len(idx), *shape), dtype=dtype, device=params[0].device)
            for j, i in enumerate(idx):
                self.out[i] = stack[j]
                if tuple(params[i].shape) != shape:
                    self.tcols[i] = params[i].shape[1]
            self.stacks.append(Stack(stack, [params[i] for i in idx], block))
        self.dtype = dtype


def merged(b, device: torch.device) -> bool:
    """Whether NS runs fused (``ns_fused``; None: on CUDA), so that a tall shape shares its
    transpose's stack (as ``orthogonalise`` merges them only then)."""
    fused = b.preconditioner.fused
    return fused if fused is not None else device.type == "cuda"


def plan(b, cols: dict, cache: PlanCache, block: int) -> tuple[Plan, Stacks]:
    """The pre-pass's plan (the stacks' slices in its ``C_OUT`` column) and the stacks."""
    dtype, params = ns_dtype(b), cols[L.C_P]
    merge = merged(b, params[0].device)
    stacks = cache.get(key({L.C_P: params}, block, ("ns-stacks", dtype, merge)),
                       lambda: Stacks(params, dtype, block, merge))  # fmt: skip
    cols = {**cols, L.C_OUT: stacks.out}
    norm = b.view.get("variance_reduction", False) and b.view.get("clip") == "tensor"
    return cache.get(key(cols, block, ("ns", norm, merge)),
                     lambda: Plan(cols, block, norm=norm, tcols=stacks.tcols)), stacks  # fmt: skip


def run(go, k, ln, divisors, flag, update) -> None:
    """The pre-pass (``update``: optim/engine/launch.py), NS per stack, the update per stack
    (``go``: launch, or with ``go.dry`` compile only: NS is then not computed)."""
    plan, stacks, pre, view = ln.plan, ln.stacks, ln.b.preconditioner, ln.b.view
    if plan.nblocks:
        update(go, k, ln, divisors, flag, out_dtype=stacks.dtype)
    fused = merged(ln.b, plan.table.device)
    lr, keep = view["lr"], 1 - view["lr"] * view["weight_decay"]
    for s in stacks.stacks:
        sub = s.plan
        if not sub.nblocks:
            continue
        if go.dry:  # the layout NS leaves a tall stack's result in, without computing it
            res = s.stack.mT.contiguous().mT if s.flip else s.stack
        else:
            res = newton_schulz(s.stack, pre.steps, pre.eps, stacks.dtype, fused=fused)
        base = res.mT if s.flip else res
        if not base.is_contiguous():  # not the layout expected: made so (a copy)
            base = base.contiguous()
        shape, other = s.read, s.read[::-1]
        go(
            k.apply_kernel, (sub.nblocks,), sub.table, sub.blocks, base,
            sub.blocks if flag is None else flag, keep, -(lr * pre.scale(shape)),
            -(lr * pre.scale(other)), DT=tl_dtype(ln.dtype), SRC_DT=tl_dtype(stacks.dtype),
            BLOCK=sub.block, STRIDED=sub.strided, HAS_SKIP=flag is not None, ALIGNED=sub.aligned,
            TILE=L.tile_rows(sub.block), num_warps=warps(sub.block),
        )  # fmt: skip
