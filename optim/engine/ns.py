"""Newton-Schulz buckets on the engine: persistent per-shape stacks, batched NS, one update pass
per shape.

For a bucket whose preconditioner is ``newton-schulz`` (Muon, Moonlight, MARS-M,
MARS-M-Efficient, MARS-Shampoo's matrices), one step is:

1. the pre-pass (``step_kernel`` with ``DIRECTION=NS_OUT``): correction, clip, reference copy and
   momentum as every other bucket, then ``u`` (divided by ``1 - beta1`` with ``ns_debias``) is
   written straight into its slice of a persistent stack per shape, ``(k, rows, cols)`` in the
   Newton-Schulz dtype (bf16 by default): no stacking copy, no cast;
2. ``newton_schulz`` on each stack (optim/functional.py: the batched iteration, ``ns_fused`` as
   the group says), the same call the foreach path's ``orthogonalise`` makes per shape;
3. ``apply_kernel`` per shape: ``p = p * (1 - lr * wd) - lr * scale(shape) * O``, reading the
   result where NS left it (a tall shape's result is its transpose's, read transposed).

The stacks are allocated once per set of matrices (cached as plans are, optim/engine/tables.py)
and kept; under a
device skip flag the pre-pass writes nothing, NS runs on the last step's stack and the update
pass writes nothing. Split over DDP ranks (``ns_distributed`` with a world above 1) and the
per-matrix reference (``ns_batched=False``) stay on the eager path (optim/engine/rules.py).
"""

from __future__ import annotations

import torch

from optim.engine import layout as L
from optim.engine.loader import tl_dtype, warps
from optim.engine.rules import ns_dtype
from optim.engine.tables import Plan, PlanCache, key
from optim.functional import newton_schulz


class Stacks:
    """A Newton-Schulz bucket's persistent stacks, one per shape, with a small plan per shape
    for the update pass; kept per set of parameters (not per gradient tensors)."""

    def __init__(self, params: list, dtype: torch.dtype, block: int) -> None:
        by_shape: dict[tuple, list[int]] = {}
        for i, p in enumerate(params):
            by_shape.setdefault(tuple(p.shape), []).append(i)
        self.out: list = [None] * len(params)  # each matrix's slice of its stack
        self.shapes = []
        for shape, idx in by_shape.items():
            stack = torch.zeros((len(idx), *shape), dtype=dtype, device=params[0].device)
            for j, i in enumerate(idx):
                self.out[i] = stack[j]
            self.shapes.append((shape, stack, Plan({L.C_P: [params[i] for i in idx]}, block)))
        self.dtype = dtype


def plan(b, cols: dict, cache: PlanCache, block: int) -> tuple[Plan, Stacks]:
    """The pre-pass's plan (the stacks' slices in its ``C_OUT`` column) and the stacks."""
    dtype, params = ns_dtype(b), cols[L.C_P]
    stacks = cache.get(key({L.C_P: params}, block, ("ns-stacks", dtype)),
                       lambda: Stacks(params, dtype, block))  # fmt: skip
    cols = {**cols, L.C_OUT: stacks.out}
    norm = b.view.get("variance_reduction", False) and b.view.get("clip") == "tensor"
    return cache.get(key(cols, block, ("ns", norm)), lambda: Plan(cols, block, norm=norm)), stacks


def run(go, k, ln, divisors, flag, update) -> None:
    """The pre-pass (``update``: optim/engine/launch.py), NS per stack, the update per shape
    (``go``: launch, or with ``go.dry`` compile only: NS is then not computed)."""
    plan, stacks, pre, view = ln.plan, ln.stacks, ln.b.preconditioner, ln.b.view
    if plan.nblocks:
        update(go, k, ln, divisors, flag, out_dtype=stacks.dtype)
    fused = pre.fused if pre.fused is not None else plan.table.device.type == "cuda"
    lr, keep = view["lr"], 1 - view["lr"] * view["weight_decay"]
    for shape, stack, sub in stacks.shapes:
        if not sub.nblocks:
            continue
        if go.dry:  # the layout NS leaves a tall shape's result in, without computing it
            res = stack.mT.contiguous().mT if shape[0] > shape[1] else stack
        else:
            res = newton_schulz(stack, pre.steps, pre.eps, stacks.dtype, fused=fused)
        transposed = not res.is_contiguous() and res.mT.is_contiguous()
        base = res.mT if transposed else res.contiguous()
        go(
            k.apply_kernel, (sub.nblocks,), sub.table, sub.blocks, base, sub.blocks if flag is None else flag, keep,
            -(lr * pre.scale(shape)), shape[0], shape[1], DT=tl_dtype(ln.dtype),
            SRC_DT=tl_dtype(stacks.dtype), BLOCK=sub.block, TRANSPOSED=transposed,
            HAS_SKIP=flag is not None, ALIGNED=sub.aligned, num_warps=warps(sub.block),
        )  # fmt: skip
