"""The engine's Triton kernels (imported through optim/engine/loader.py, never directly).

Every kernel walks a bucket's tensors through two tables built once per bucket
(optim/engine/tables.py): ``table``, one row of ``NCOLS`` int64 per tensor (the addresses of its
parameter, gradient and state tensors, its size, its first block and number of blocks), and
``blocks``, one ``(tensor, block)`` pair of int32 per program. Hyperparameters are scalar
arguments (a new lr or step count is a new argument, not a new compile); the choice of rule is
``tl.constexpr`` flags. The arithmetic follows the foreach path op for op (the same
multiplications, the same order, IEEE division and square root), so the two agree to the last
bits where the device rounds alike (tests/test_engine.py).
"""

from __future__ import annotations

import triton
import triton.language as tl

from optim.engine import layout

# the layout's columns as constants the kernels may read (optim/engine/layout.py)
C_P, C_G, C_REF, C_M, C_V, C_X, C_OUT, C_NUMEL, C_FIRST, C_NBLK, C_TCOLS = (
    tl.constexpr(getattr(layout, n)) for n in
    ("C_P", "C_G", "C_REF", "C_M", "C_V", "C_X", "C_OUT", "C_NUMEL", "C_FIRST", "C_NBLK",
     "C_TCOLS")
)  # fmt: skip
NCOLS = tl.constexpr(layout.NCOLS)


@triton.jit
def _lerp(a, b, w):
    """torch.lerp's two-branch formula (exact at both ends)."""
    return tl.where(w < 0.5, a + w * (b - a), b - (b - a) * (1.0 - w))


@triton.jit
def _sum(x):
    """``tl.sum(x, 0)`` as the reduction it is: ``tl.sum`` itself is a ``triton.jit`` function
    decorated when triton was imported (compiled, not interpreted, unless ``TRITON_INTERPRET``
    was set then), while ``tl.reduce`` with this combine function is what the interpreter
    recognises and runs as ``np.sum``."""
    return tl.reduce(x, 0, tl.standard._sum_combine)


@triton.jit
def _div(a, b):
    """IEEE division, as torch's (Triton's ``/`` on float32 is approximate by default)."""
    return tl.fdiv(a, b, ieee_rounding=True)


@triton.jit
def _sqrt(x):
    """IEEE square root, as torch's (``tl.sqrt`` is approximate on float32; on float64 it is
    correctly rounded, where ``sqrt_rn`` does not exist)."""
    if x.dtype == tl.float64:
        return tl.sqrt(x)
    else:
        return tl.sqrt_rn(x)


@triton.jit
def _narrow(x, DT: tl.constexpr):
    """``x`` in ``DT`` rounded as torch rounds: by way of float32, then to bf16 by
    round-to-nearest-even on the bits (Triton's interpreter truncates a cast to bf16; written
    out, the compiled kernel and the interpreter round alike, NaN kept a NaN)."""
    if DT == tl.bfloat16:
        x = x.to(tl.float32)
        bits = x.to(tl.uint32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        rounded = tl.where(x != x, 0x7FC0, rounded)
        return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    elif DT == tl.float16:
        return x.to(tl.float32).to(DT)
    else:
        return x.to(DT)


@triton.jit
def _ptr(row, col, DT: tl.constexpr, ALIGNED: tl.constexpr):
    """Column ``col``'s address in ``row`` as a pointer to ``DT``; ``ALIGNED`` (every address of
    the plan 16-byte aligned, checked on the host): said so, for vectorised loads and stores."""
    p = tl.load(row + col).to(tl.pointer_type(DT))
    if ALIGNED:
        p = tl.multiple_of(p, 16)
    return p


@triton.jit
def _ld(ptr, offs, mask, MASKED: tl.constexpr):
    """A load, masked only in a tensor's last block (a mask from a size read at run time keeps
    the compiler from vectorising)."""
    if MASKED:
        return tl.load(ptr + offs, mask=mask, other=0.0)
    else:
        return tl.load(ptr + offs)


@triton.jit
def _st(ptr, offs, value, mask, MASKED: tl.constexpr):
    if MASKED:
        tl.store(ptr + offs, value, mask=mask)
    else:
        tl.store(ptr + offs, value)


@triton.jit
def _size(row, skip, HAS_SKIP: tl.constexpr):
    """The tensor's size, or 0 where the skip flag is set: every block then takes the masked
    path with nothing in its mask (a bound, not ``mask & flag``, which the interpreter turns
    into a mask it refuses)."""
    n = tl.load(row + C_NUMEL)
    if HAS_SKIP:
        n = tl.where(tl.load(skip) == 0, n, 0)
    return n


@triton.jit
def norm_kernel(table, blocks, partial, kappa, gscale, DT: tl.constexpr, ACC: tl.constexpr,
                BLOCK: tl.constexpr, ALIGNED: tl.constexpr, REDUCE: tl.constexpr,
                GSCALE: tl.constexpr):  # fmt: skip
    """``partial[program] = sum(c * c)`` over one block, ``c = g + kappa * (g - g_ref)``
    (``REDUCE``; else ``c = g``: the global gradient clip's norm), ``g`` times the folded clip's
    factor ``gscale[0]`` where ``GSCALE``."""
    pid = tl.program_id(0)
    t = tl.load(blocks + 2 * pid).to(tl.int64)
    j = tl.load(blocks + 2 * pid + 1).to(tl.int64)
    row = table + t * NCOLS
    offs = j * BLOCK + tl.arange(0, BLOCK)
    n = tl.load(row + C_NUMEL)
    g_ptr = _ptr(row, C_G, DT, ALIGNED)
    whole = (j + 1) * BLOCK <= n
    if whole:
        g = tl.load(g_ptr + offs)
    else:
        g = tl.load(g_ptr + offs, mask=offs < n, other=0.0)
    if GSCALE:
        g = g * tl.load(gscale)
    c = g
    if REDUCE:
        ref_ptr = _ptr(row, C_REF, DT, ALIGNED)
        if whole:
            ref = tl.load(ref_ptr + offs)
        else:
            ref = tl.load(ref_ptr + offs, mask=offs < n, other=0.0)
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
    pid = tl.program_id(0)
    t = tl.load(blocks + 2 * pid).to(tl.int64)
    j = tl.load(blocks + 2 * pid + 1).to(tl.int64)
    row = table + t * NCOLS
    offs = j * BLOCK + tl.arange(0, BLOCK)
    n = tl.load(row + C_NUMEL)
    g_ptr = _ptr(row, C_G, DT, ALIGNED)
    whole = (j + 1) * BLOCK <= n
    if whole:
        g = tl.load(g_ptr + offs)
    else:
        g = tl.load(g_ptr + offs, mask=offs < n, other=0.0)
    g = g.to(ACC)
    gg = _sum(g * g)
    gr = tl.full([], 0.0, ACC)
    rr = tl.full([], 0.0, ACC)
    if tl.load(row + C_REF) != 0:
        ref_ptr = _ptr(row, C_REF, DT, ALIGNED)
        if whole:
            ref = tl.load(ref_ptr + offs)
        else:
            ref = tl.load(ref_ptr + offs, mask=offs < n, other=0.0)
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


@triton.jit
def step_kernel(table, blocks, divisors, skip, gscale, kappa, beta, m_add, lion_u, lion_m, b2, v_add,
                keep, neg_size, bc2s, bc1, eps, mix, b3, s_add,
                DT: tl.constexpr, OUT_DT: tl.constexpr, BLOCK: tl.constexpr,
                REDUCE: tl.constexpr, CLIP: tl.constexpr, COPY_REF: tl.constexpr,
                MOMENTUM: tl.constexpr, DIRECTION: tl.constexpr, AMSGRAD: tl.constexpr,
                SRC_C: tl.constexpr, FIRST: tl.constexpr, HAS_SKIP: tl.constexpr,
                ALIGNED: tl.constexpr, GSCALE: tl.constexpr, STRIDED: tl.constexpr,
                TILE: tl.constexpr):  # fmt: skip
    """One block of one tensor: correction and clip, reference copy, momentum, direction, step
    (optim/engine/rules.py says which scalar is which). Where ``skip`` (a device flag) is set,
    every load and store is masked off: nothing changes, and no host read decides it. Where
    ``GSCALE``, every gradient is read times ``gscale[0]`` (the trainer's global clip, folded:
    optim/engine/clip.py), so the step and the reference copy see the clipped gradient.
    ``STRIDED`` (Newton-Schulz's pre-pass): a row with ``C_TCOLS`` set is a tall matrix whose
    ``u`` goes transposed into its stack slice; its blocks are ``(TILE, BLOCK // TILE)`` tiles
    (row-major over the tiles), read along its rows and written along its columns, each
    coalesced (the compiler moves the tile between the two through shared memory)."""
    pid = tl.program_id(0)
    t = tl.load(blocks + 2 * pid).to(tl.int64)
    j = tl.load(blocks + 2 * pid + 1).to(tl.int64)
    row = table + t * NCOLS
    n = _size(row, skip, HAS_SKIP)
    if STRIDED:
        cols = tl.load(row + C_TCOLS)
        if cols > 0:
            rows = tl.load(row + C_NUMEL) // cols
            i, k = _tile(j, rows, cols, BLOCK, TILE)
            offs = i * cols + k
            _step(row, offs, (i < rows) & (k < cols) & (offs < n), k * rows + i, t, divisors,
                  gscale, kappa, beta, m_add, lion_u, lion_m, b2, v_add, keep, neg_size, bc2s,
                  bc1, eps, mix, b3, s_add, DT, OUT_DT, REDUCE, CLIP, COPY_REF, MOMENTUM,
                  DIRECTION, AMSGRAD, SRC_C, FIRST, ALIGNED, GSCALE, True)  # fmt: skip
        else:
            _flat(row, j, n, t, divisors, gscale, kappa, beta, m_add, lion_u, lion_m, b2, v_add,
                  keep, neg_size, bc2s, bc1, eps, mix, b3, s_add, DT, OUT_DT, BLOCK, REDUCE,
                  CLIP, COPY_REF, MOMENTUM, DIRECTION, AMSGRAD, SRC_C, FIRST, ALIGNED,
                  GSCALE)  # fmt: skip
    else:
        _flat(row, j, n, t, divisors, gscale, kappa, beta, m_add, lion_u, lion_m, b2, v_add,
              keep, neg_size, bc2s, bc1, eps, mix, b3, s_add, DT, OUT_DT, BLOCK, REDUCE, CLIP,
              COPY_REF, MOMENTUM, DIRECTION, AMSGRAD, SRC_C, FIRST, ALIGNED, GSCALE)  # fmt: skip


@triton.jit
def _tile(j, rows, cols, BLOCK: tl.constexpr, TILE: tl.constexpr):
    """Row and column indices (``(TILE, 1)`` and ``(1, BLOCK // TILE)``) of tile ``j`` of a
    ``(rows, cols)`` matrix, the tiles row-major (``layout.tiles`` counts them)."""
    across = (cols + BLOCK // TILE - 1) // (BLOCK // TILE)
    i = (j // across) * TILE + tl.arange(0, TILE)[:, None]
    k = (j % across) * (BLOCK // TILE) + tl.arange(0, BLOCK // TILE)[None, :]
    return i, k


@triton.jit
def _flat(row, j, n, t, divisors, gscale, kappa, beta, m_add, lion_u, lion_m, b2, v_add, keep,
          neg_size, bc2s, bc1, eps, mix, b3, s_add, DT: tl.constexpr, OUT_DT: tl.constexpr,
          BLOCK: tl.constexpr, REDUCE: tl.constexpr, CLIP: tl.constexpr,
          COPY_REF: tl.constexpr, MOMENTUM: tl.constexpr, DIRECTION: tl.constexpr,
          AMSGRAD: tl.constexpr, SRC_C: tl.constexpr, FIRST: tl.constexpr,
          ALIGNED: tl.constexpr, GSCALE: tl.constexpr):  # fmt: skip
    """``step_kernel`` on block ``j`` of a tensor as a flat range: unmasked where whole."""
    offs = j * BLOCK + tl.arange(0, BLOCK)
    if (j + 1) * BLOCK <= n:  # a whole block: unmasked
        _step(row, offs, offs < n, offs, t, divisors, gscale, kappa, beta, m_add, lion_u, lion_m,
              b2, v_add, keep, neg_size, bc2s, bc1, eps, mix, b3, s_add, DT, OUT_DT, REDUCE,
              CLIP, COPY_REF, MOMENTUM, DIRECTION, AMSGRAD, SRC_C, FIRST, ALIGNED, GSCALE,
              False)  # fmt: skip
    else:
        _step(row, offs, offs < n, offs, t, divisors, gscale, kappa, beta, m_add, lion_u, lion_m,
              b2, v_add, keep, neg_size, bc2s, bc1, eps, mix, b3, s_add, DT, OUT_DT, REDUCE,
              CLIP, COPY_REF, MOMENTUM, DIRECTION, AMSGRAD, SRC_C, FIRST, ALIGNED, GSCALE,
              True)  # fmt: skip


@triton.jit
def _step(row, offs, mask, at, t, divisors, gscale, kappa, beta, m_add, lion_u, lion_m, b2, v_add,
          keep, neg_size, bc2s, bc1, eps, mix, b3, s_add, DT: tl.constexpr,
          OUT_DT: tl.constexpr, REDUCE: tl.constexpr, CLIP: tl.constexpr,
          COPY_REF: tl.constexpr, MOMENTUM: tl.constexpr, DIRECTION: tl.constexpr,
          AMSGRAD: tl.constexpr, SRC_C: tl.constexpr, FIRST: tl.constexpr,
          ALIGNED: tl.constexpr, GSCALE: tl.constexpr, MASKED: tl.constexpr):  # fmt: skip
    """``step_kernel``'s work on one block (``MASKED``: the tensor's last, a tile, or a skipped
    step); ``at``: where the block's elements go in Newton-Schulz's stack slice. Every stream
    the block reads is loaded before any is stored (``_loads``): the loads are in flight
    together instead of each waiting on a store before it (the tensors never alias)."""
    g_ptr, ref_ptr, m_ptr, p_ptr, v_ptr, x_ptr = _ptrs(row, DT, REDUCE, DIRECTION, AMSGRAD,
                                                       FIRST, ALIGNED)  # fmt: skip
    if DIRECTION == 5:  # Newton-Schulz's stack slice (written only)
        out = _ptr(row, C_OUT, OUT_DT, ALIGNED)
    g, ref, m, p, v, x = _loads(g_ptr, ref_ptr, m_ptr, p_ptr, v_ptr, x_ptr, offs, mask, REDUCE,
                                DIRECTION, AMSGRAD, FIRST, MASKED)  # fmt: skip
    if GSCALE:
        g = g * tl.load(gscale)
    c = g
    if REDUCE:
        c = g + kappa * (g - ref)
        if CLIP == 1:
            c = c * tl.load(divisors + t)
        if CLIP == 2:
            c = _div(c, tl.load(divisors))
        if COPY_REF:
            _st(ref_ptr, offs, g, mask, MASKED)
    if MOMENTUM == 0:  # ema: m = beta * m + (1 - beta) * c, as mul then add
        m = m * beta + m_add * c
        u = m
    if MOMENTUM == 1:  # ema-lerp
        m = _lerp(m, c, m_add)
        u = m
    if MOMENTUM == 2:  # lion: u = lerp(c, m, beta1); m = lerp(m, c, 1 - beta2)
        u = _lerp(c, m, lion_u)
        m = _lerp(m, c, lion_m)
    if MOMENTUM == 3:  # heavy-ball: buf = mu * buf + g; u = buf
        m = m * beta + c
        u = m
    if MOMENTUM == 4:  # heavy-ball, Nesterov: u = mu * buf + g
        m = m * beta + c
        u = m * beta + c
    if MOMENTUM == 5:  # one-buffer: buf = mu * buf + phi * g; u = gamma * g + mu * buf
        m = m * beta + m_add * c
        u = c * mix + m * beta
    if FIRST:  # SOAP's first step: the basis only, the momentum back to zero, no update
        _st(m_ptr, offs, m * 0.0, mask, MASKED)
    else:
        _st(m_ptr, offs, m, mask, MASKED)
        if DIRECTION == 5:  # Newton-Schulz's input, into its stack: u / divisor in NS's dtype
            _st(out, at, _narrow(_div(u, bc1), OUT_DT), mask, MASKED)
        else:
            _direction(p_ptr, v_ptr, x_ptr, offs, mask, c, g, u, p, v, x, b2, v_add, keep,
                       neg_size, bc2s, bc1, eps, mix, b3, s_add, DIRECTION, AMSGRAD, SRC_C,
                       MASKED)  # fmt: skip


@triton.jit
def _ptrs(row, DT: tl.constexpr, REDUCE: tl.constexpr, DIRECTION: tl.constexpr,
          AMSGRAD: tl.constexpr, FIRST: tl.constexpr, ALIGNED: tl.constexpr):  # fmt: skip
    """The addresses of every stream a ``step_kernel`` block touches, read from the table once
    (a stream the rule does not touch: ``g``'s, never loaded or stored)."""
    g_ptr = _ptr(row, C_G, DT, ALIGNED)
    ref_ptr, p_ptr, v_ptr, x_ptr = g_ptr, g_ptr, g_ptr, g_ptr
    if REDUCE:
        ref_ptr = _ptr(row, C_REF, DT, ALIGNED)
    m_ptr = _ptr(row, C_M, DT, ALIGNED)
    if not FIRST:
        if DIRECTION != 5:
            p_ptr = _ptr(row, C_P, DT, ALIGNED)
        if DIRECTION != 2:
            if DIRECTION != 5:
                v_ptr = _ptr(row, C_V, DT, ALIGNED)
        if AMSGRAD:
            x_ptr = _ptr(row, C_X, DT, ALIGNED)
        if DIRECTION == 3:
            x_ptr = _ptr(row, C_X, DT, ALIGNED)
    return g_ptr, ref_ptr, m_ptr, p_ptr, v_ptr, x_ptr


@triton.jit
def _loads(g_ptr, ref_ptr, m_ptr, p_ptr, v_ptr, x_ptr, offs, mask, REDUCE: tl.constexpr,
           DIRECTION: tl.constexpr, AMSGRAD: tl.constexpr, FIRST: tl.constexpr,
           MASKED: tl.constexpr):  # fmt: skip
    """Every stream a ``step_kernel`` block reads: ``g``, ``g_ref``, the momentum, and where
    the rule reads them ``p``, ``v`` and the extra state (v_max, AdEMAMix's slow EMA); a stream
    the rule does not read is ``g`` (a name only: nothing loaded)."""
    g = _ld(g_ptr, offs, mask, MASKED)
    ref, p, v, x = g, g, g, g
    if REDUCE:
        ref = _ld(ref_ptr, offs, mask, MASKED)
    m = _ld(m_ptr, offs, mask, MASKED)
    if not FIRST:
        if DIRECTION != 5:
            p = _ld(p_ptr, offs, mask, MASKED)
        if DIRECTION != 2:
            if DIRECTION != 5:
                v = _ld(v_ptr, offs, mask, MASKED)
        if AMSGRAD:
            x = _ld(x_ptr, offs, mask, MASKED)
        if DIRECTION == 3:
            x = _ld(x_ptr, offs, mask, MASKED)
    return g, ref, m, p, v, x


@triton.jit
def _direction(p_ptr, v_ptr, x_ptr, offs, mask, c, g, u, p, v, x, b2, v_add, keep, neg_size,
               bc2s, bc1, eps, mix, b3, s_add, DIRECTION: tl.constexpr, AMSGRAD: tl.constexpr,
               SRC_C: tl.constexpr, MASKED: tl.constexpr):  # fmt: skip
    """The preconditioner's direction and ``p = p * keep - size * d`` (foreach's op order), on
    the loaded ``p``, ``v`` and ``x``; stores them."""
    p = p * keep
    if DIRECTION == 2:  # sign
        d = tl.where(u > 0, 1.0, tl.where(u < 0, -1.0, u * 0.0))
        p = p + neg_size * d
    else:
        if SRC_C:
            s = c
        else:
            s = g
        if DIRECTION == 1:  # v.lerp_(s * s, 1 - beta2)
            v = _lerp(v, s * s, v_add)
        elif DIRECTION == 4:  # SOAP: v * beta2 + (1 - beta2) * s^2
            v = v * b2 + v_add * (s * s)
        else:  # addcmul: v * beta2 + ((1 - beta2) * s) * s
            v = v * b2 + v_add * s * s
        _st(v_ptr, offs, v, mask, MASKED)
        if AMSGRAD:
            v = tl.maximum(x, v)
            _st(x_ptr, offs, v, mask, MASKED)
        root = _sqrt(v)
        if DIRECTION == 0:  # MARS: ((sqrt(v) / sqrt(1 - beta2^t)) + eps) * (1 - beta1^t)
            p = p + _div(neg_size * u, (_div(root, bc2s) + eps) * bc1)
        elif DIRECTION == 1:  # Moonlight / MARS-M / the MARS repo's AdamW
            p = p + _div(neg_size * u, root + eps)
        elif DIRECTION == 4:  # SOAP's Adam on an unrotated tensor
            p = p + neg_size * _div(u, root + eps)
        else:  # AdEMAMix: (m / bc1 + alpha * slow) / (sqrt(v) / sqrt(bc2) + eps)
            slow = x * b3 + s_add * c
            _st(x_ptr, offs, slow, mask, MASKED)
            num = _div(u, bc1) + mix * slow
            p = p + _div(neg_size * num, _div(root, bc2s) + eps)
    _st(p_ptr, offs, p, mask, MASKED)


@triton.jit
def apply_kernel(table, blocks, src, skip, keep, neg_size, neg_size_t, DT: tl.constexpr,
                 SRC_DT: tl.constexpr, BLOCK: tl.constexpr, STRIDED: tl.constexpr,
                 HAS_SKIP: tl.constexpr, ALIGNED: tl.constexpr, TILE: tl.constexpr):  # fmt: skip
    """``p = p * keep - size * O`` for the matrices of one stack, ``O`` their Newton-Schulz
    results in ``src`` (row ``t``'s at ``src + t * numel``). ``STRIDED``: a row with
    ``C_TCOLS`` set reads its result transposed, by tiles as ``step_kernel`` writes it, and
    steps by ``neg_size_t`` (its own shape's scale); the others by ``neg_size``."""
    pid = tl.program_id(0)
    t = tl.load(blocks + 2 * pid).to(tl.int64)
    j = tl.load(blocks + 2 * pid + 1).to(tl.int64)
    row = table + t * NCOLS
    n = _size(row, skip, HAS_SKIP)
    numel = tl.load(row + C_NUMEL)
    base = src + t * numel
    p_ptr = _ptr(row, C_P, DT, ALIGNED)
    # (a scalar argument is passed on where it is read: the interpreter rounds one assigned to
    # a name to float32, as the compiled kernel's float arguments are)
    if STRIDED:
        cols = tl.load(row + C_TCOLS)
        if cols > 0:
            rows = numel // cols
            i, k = _tile(j, rows, cols, BLOCK, TILE)
            at = i * cols + k  # (a name of its own: the branches' types differ)
            _apply(p_ptr, at, base + k * rows + i, (i < rows) & (k < cols) & (at < n), keep,
                   neg_size_t, SRC_DT, DT)  # fmt: skip
        else:
            offs = j * BLOCK + tl.arange(0, BLOCK)
            _apply(p_ptr, offs, base + offs, offs < n, keep, neg_size, SRC_DT, DT)
    else:
        offs = j * BLOCK + tl.arange(0, BLOCK)
        _apply(p_ptr, offs, base + offs, offs < n, keep, neg_size, SRC_DT, DT)


@triton.jit
def _apply(p_ptr, offs, o_ptrs, mask, keep, neg_size, SRC_DT: tl.constexpr, DT: tl.constexpr):
    p = tl.load(p_ptr + offs, mask=mask, other=0.0) * keep
    o = _widen(tl.load(o_ptrs, mask=mask, other=0.0), SRC_DT, DT)
    tl.store(p_ptr + offs, p + neg_size * o, mask=mask)


@triton.jit
def _widen(o, SRC_DT: tl.constexpr, DT: tl.constexpr):
    """A Newton-Schulz result in the parameter's dtype: bf16 and fp16 by way of float32 (exact),
    as ``_narrow``."""
    if SRC_DT == tl.bfloat16 or SRC_DT == tl.float16:
        o = o.to(tl.float32)
    return o.to(DT)


@triton.jit
def schedulefree_kernel(table, blocks, gscale, b2, v_add, bc2, eps, decay, ckp1, y_coef, lr,
                        DT: tl.constexpr, BLOCK: tl.constexpr, DECAY: tl.constexpr,
                        ALIGNED: tl.constexpr, GSCALE: tl.constexpr):  # fmt: skip
    """Schedule-Free AdamW (optim/schedulefree.py): y (the parameter), z (``C_M``), v; ``g``
    times ``gscale[0]`` where ``GSCALE`` (the folded global clip)."""
    pid = tl.program_id(0)
    t = tl.load(blocks + 2 * pid).to(tl.int64)
    j = tl.load(blocks + 2 * pid + 1).to(tl.int64)
    row = table + t * NCOLS
    offs = j * BLOCK + tl.arange(0, BLOCK)
    n = tl.load(row + C_NUMEL)
    if (j + 1) * BLOCK <= n:
        _schedulefree(row, offs, offs < n, gscale, b2, v_add, bc2, eps, decay, ckp1, y_coef, lr,
                      DT, DECAY, ALIGNED, GSCALE, False)  # fmt: skip
    else:
        _schedulefree(row, offs, offs < n, gscale, b2, v_add, bc2, eps, decay, ckp1, y_coef, lr,
                      DT, DECAY, ALIGNED, GSCALE, True)  # fmt: skip


@triton.jit
def _schedulefree(row, offs, mask, gscale, b2, v_add, bc2, eps, decay, ckp1, y_coef, lr,
                  DT: tl.constexpr, DECAY: tl.constexpr, ALIGNED: tl.constexpr,
                  GSCALE: tl.constexpr, MASKED: tl.constexpr):  # fmt: skip
    y_ptr, z_ptr = _ptr(row, C_P, DT, ALIGNED), _ptr(row, C_M, DT, ALIGNED)
    v_ptr = _ptr(row, C_V, DT, ALIGNED)
    g = _ld(_ptr(row, C_G, DT, ALIGNED), offs, mask, MASKED)
    if GSCALE:
        g = g * tl.load(gscale)
    y, z = _ld(y_ptr, offs, mask, MASKED), _ld(z_ptr, offs, mask, MASKED)
    v = _ld(v_ptr, offs, mask, MASKED) * b2 + v_add * g * g
    _st(v_ptr, offs, v, mask, MASKED)
    d = _div(g, _sqrt(_div(v, bc2)) + eps)
    if DECAY:
        d = d + decay * y
    _st(y_ptr, offs, _lerp(y, z, ckp1) + y_coef * d, mask, MASKED)
    _st(z_ptr, offs, z - lr * d, mask, MASKED)
