"""The norm passes and their finish: the MARS clip's and the trainer's global clip's kernels.

Imported through optim/engine/loader.py with the update kernels (optim/engine/kernels.py, whose
module holds these too), never directly. ``norm_kernel`` and ``fold_norm_kernel`` write a
partial sum per block; the finish kernels turn a tensor's, or every tensor's, partials into a
clip's factor on the device (optim/engine/launch.py, clip.py).
"""

from __future__ import annotations

import triton
import triton.language as tl

from optim.engine.kernel_ops import (
    C_FIRST,
    C_G,
    C_NBLK,
    C_NUMEL,
    C_REF,
    NCOLS,
    _div,
    _ld_block,
    _program,
    _ptr,
    _sqrt,
    _sum,
)


@triton.jit
def _grad_block(table, blocks, DT: tl.constexpr, BLOCK: tl.constexpr, ALIGNED: tl.constexpr):
    """A norm pass's program: its number, its tensor's table row, its block's offsets, the
    tensor's size, whether the block is whole, and the block of ``g``."""
    pid, t, j, row = _program(table, blocks)
    offs = j * BLOCK + tl.arange(0, BLOCK)
    n = tl.load(row + C_NUMEL)
    g_ptr = _ptr(row, C_G, DT, ALIGNED)
    whole = (j + 1) * BLOCK <= n
    return pid, row, offs, n, whole, _ld_block(g_ptr, offs, n, whole)


@triton.jit
def norm_kernel(table, blocks, partial, kappa, gscale, DT: tl.constexpr, ACC: tl.constexpr,
                BLOCK: tl.constexpr, ALIGNED: tl.constexpr, REDUCE: tl.constexpr,
                GSCALE: tl.constexpr):  # fmt: skip
    """``partial[program] = sum(c * c)`` over one block, ``c = g + kappa * (g - g_ref)``
    (``REDUCE``; else ``c = g``: the global gradient clip's norm), ``g`` times the folded clip's
    factor ``gscale[0]`` where ``GSCALE``."""
    pid, row, offs, n, whole, g = _grad_block(table, blocks, DT, BLOCK, ALIGNED)
    if GSCALE:
        g = g * tl.load(gscale)
    c = g
    if REDUCE:
        ref_ptr = _ptr(row, C_REF, DT, ALIGNED)
        ref = _ld_block(ref_ptr, offs, n, whole)
        c = g + kappa * (g - ref)
    c = c.to(ACC)
    tl.store(partial + pid, _sum(c * c))


@triton.jit
def fold_norm_kernel(table, blocks, partial, stride, DT: tl.constexpr, ACC: tl.constexpr,
                     BLOCK: tl.constexpr, ALIGNED: tl.constexpr):  # fmt: skip
    """The folded global clip's norm pass merged with MARS's (optim/engine/clip.py): over one
    block, ``partial[program] = sum(g * g)`` and, for a row with a reference gradient (its
    ``C_REF`` address not 0), ``partial[stride + program] = sum(g * g_ref)`` and
    ``partial[2 * stride + program] = sum(g_ref * g_ref)`` (0 for a row without one): from these
    a step computes ``||c||^2`` of ``c = a * g - kappa * g_ref``, ``a = coef * (1 + kappa)``,
    once the clip's ``coef`` is known (``merged_finish_kernel``), with no second read of g."""
    pid, row, offs, n, whole, g = _grad_block(table, blocks, DT, BLOCK, ALIGNED)
    g = g.to(ACC)
    gg = _sum(g * g)
    gr = tl.full([], 0.0, ACC)
    rr = tl.full([], 0.0, ACC)
    if tl.load(row + C_REF) != 0:
        ref_ptr = _ptr(row, C_REF, DT, ALIGNED)
        ref = _ld_block(ref_ptr, offs, n, whole)
        ref = ref.to(ACC)
        gr = _sum(g * ref)
        rr = _sum(ref * ref)
    tl.store(partial + pid, gg)  # (every load before the stores)
    tl.store(partial + stride + pid, gr)
    tl.store(partial + 2 * stride + pid, rr)


@triton.jit
def merged_finish_kernel(table, partial, stride, rows, coef, kappa, out, SUMMED: tl.constexpr,
                         GLOBAL: tl.constexpr, CHUNK: tl.constexpr):  # fmt: skip
    """MARS's clip of ``c = coef * g + kappa * (coef * g - g_ref)`` for tensor ``t`` of a
    launch from ``fold_norm_kernel``'s sums (the fold's row ``rows[t]``; -1: none, 0): ``||c||^2 = a^2 Sgg - 2 a kappa Sgr + kappa^2 Srr``, ``a = coef[0] * (1 + kappa)``,
    kept from going below 0 by rounding (a NaN kept). ``out[t] = 1 / max(1, ||c||)`` (the
    per-tensor clip), or ``||c||^2`` (``GLOBAL``: one slot of the global clip's buffer, summed
    by ``finish_global_kernel``). ``SUMMED``: the sums are per row already (FSDP2, after their
    all-reduce: ``partial[r]``, ``partial[stride + r]``, ``partial[2 * stride + r]``), else
    per block of the fold's table row ``r``."""
    t = tl.program_id(0).to(tl.int64)
    r = tl.load(rows + t)
    has = r >= 0
    r = tl.maximum(r, 0)
    if SUMMED:
        gg = tl.load(partial + r)
        gr = tl.load(partial + stride + r)
        rr = tl.load(partial + 2 * stride + r)
    else:
        row = table + r * NCOLS
        first = tl.load(row + C_FIRST)
        count = tl.where(has, tl.load(row + C_NBLK), 0)
        a_gg = tl.full([CHUNK], 0.0, partial.dtype.element_ty)
        a_gr = tl.full([CHUNK], 0.0, partial.dtype.element_ty)
        a_rr = tl.full([CHUNK], 0.0, partial.dtype.element_ty)
        for k in range(0, count, CHUNK):
            idx = k + tl.arange(0, CHUNK)
            a_gg += tl.load(partial + first + idx, mask=idx < count, other=0.0)
            a_gr += tl.load(partial + stride + first + idx, mask=idx < count, other=0.0)
            a_rr += tl.load(partial + 2 * stride + first + idx, mask=idx < count, other=0.0)
        gg, gr, rr = _sum(a_gg), _sum(a_gr), _sum(a_rr)
    a = tl.load(coef) * (1.0 + kappa)
    b = kappa + a * 0.0  # (kappa in the sums' dtype)
    ss = a * a * gg - 2.0 * a * b * gr + b * b * rr
    ss = tl.where(ss < 0.0, 0.0, ss)  # rounding below 0 (c about 0); a NaN stays a NaN
    ss = tl.where(has, ss, 0.0)
    if GLOBAL:
        tl.store(out + t, ss.to(out.dtype.element_ty))
    else:
        norm = tl.maximum(_sqrt(ss), 1.0).to(out.dtype.element_ty)
        tl.store(out + t, _div(tl.full([], 1.0, norm.dtype), norm))


@triton.jit
def finish_tensor_kernel(table, partial, divisors, CHUNK: tl.constexpr):
    """``divisors[t] = 1 / max(1, sqrt(sum of tensor t's partials))``: the per-tensor clip's
    factor (foreach: the norm clamped, its reciprocal, a multiplication)."""
    t = tl.program_id(0).to(tl.int64)
    row = table + t * NCOLS
    first = tl.load(row + C_FIRST)
    count = tl.load(row + C_NBLK)
    acc = tl.full([CHUNK], 0.0, partial.dtype.element_ty)
    for k in range(0, count, CHUNK):
        idx = k + tl.arange(0, CHUNK)
        acc += tl.load(partial + first + idx, mask=idx < count, other=0.0)
    norm = tl.maximum(_sqrt(_sum(acc)), 1.0).to(divisors.dtype.element_ty)
    tl.store(divisors + t, _div(tl.full([], 1.0, norm.dtype), norm))


@triton.jit
def finish_global_kernel(partial, count, divisors, CHUNK: tl.constexpr):
    """``divisors[0] = max(1, sqrt(sum of every partial))``: one clip over all the tensors."""
    acc = tl.full([CHUNK], 0.0, partial.dtype.element_ty)
    for k in range(0, count, CHUNK):
        idx = k + tl.arange(0, CHUNK)
        acc += tl.load(partial + idx, mask=idx < count, other=0.0)
    total = _sum(acc)
    tl.store(divisors, tl.maximum(_sqrt(total), 1.0).to(divisors.dtype.element_ty))


@triton.jit
def finish_clip_kernel(partial, count, out, max_norm, eps, CHUNK: tl.constexpr):
    """The global gradient clip as ``torch.nn.utils.clip_grad_norm_`` computes it:
    ``out[0] = ||g||`` over every partial, ``out[1] = min(1, max_norm / (||g|| + eps))``, the
    division as torch's (a reciprocal, then times ``max_norm``) and the clamp keeping a NaN."""
    acc = tl.full([CHUNK], 0.0, partial.dtype.element_ty)
    for k in range(0, count, CHUNK):
        idx = k + tl.arange(0, CHUNK)
        acc += tl.load(partial + idx, mask=idx < count, other=0.0)
    norm = _sqrt(_sum(acc))
    coef = _div(tl.full([], 1.0, norm.dtype), norm + eps) * max_norm
    tl.store(out, norm)
    tl.store(out + 1, tl.where(coef > 1.0, 1.0, coef).to(norm.dtype))
