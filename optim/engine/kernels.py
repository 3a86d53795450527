"""The engine's Triton kernels: the update passes (imported through optim/engine/loader.py, never
directly; its module also holds the norm passes of optim/engine/norm_kernels.py).

Every kernel walks a bucket's tensors through two tables built once per bucket
(optim/engine/tables.py): ``table``, one row of ``NCOLS`` int64 per tensor (the addresses of its
parameter, gradient and state tensors, its size, its first block and number of blocks), and
``blocks``, one ``(tensor, block)`` pair of int32 per program. Hyperparameters are scalar
arguments (a new lr or step count is a new argument, not a new compile); the choice of rule is
``tl.constexpr`` flags. The arithmetic follows the foreach path op for op (the same
multiplications, the same order, IEEE division and square root), so the two agree to the last
bits where the device rounds alike (tests/test_engine.py). The helpers and the named codes the
kernels share are optim/engine/kernel_ops.py's.
"""

from __future__ import annotations

import triton
import triton.language as tl

from optim.engine.kernel_ops import (
    ADAM,
    ADAM_LERP,
    C_G,
    C_M,
    C_NUMEL,
    C_OUT,
    C_P,
    C_REF,
    C_TCOLS,
    C_V,
    C_X,
    CLIP_GLOBAL,
    CLIP_TENSOR,
    EMA,
    EMA_LERP,
    HEAVY_BALL,
    HEAVY_NESTEROV,
    LION,
    NCOLS,
    NS_OUT,
    ONE_BUFFER,
    REF_BIT,
    SIGN,
    SOAP_ADAM,
    STATE,
    X_BIT,
    _div,
    _ld,
    _lerp,
    _narrow,
    _program,
    _ptr,
    _size,
    _sqrt,
    _st,
    _tile,
)
from optim.engine.norm_kernels import (
    finish_clip_kernel,
    finish_global_kernel,
    finish_tensor_kernel,
    fold_norm_kernel,
    merged_finish_kernel,
    norm_kernel,
)

# every kernel, the norm passes' too: the module the loader returns holds them all
__all__ = [
    "apply_kernel",
    "finish_clip_kernel",
    "finish_global_kernel",
    "finish_tensor_kernel",
    "fold_norm_kernel",
    "merged_finish_kernel",
    "norm_kernel",
    "schedulefree_kernel",
    "step_kernel",
]


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
    _, t, j, row = _program(table, blocks)
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
    # the columns the rule reads beside g's and the momentum's, a bit each: layout.STATE's row of
    # the direction and amsgrad's v_max (none on SOAP's first step), the MARS correction's g_ref
    READS: tl.constexpr = ((STATE >> DIRECTION * NCOLS | X_BIT * AMSGRAD) * (not FIRST)
                           | REF_BIT * REDUCE)  # fmt: skip
    g_ptr, ref_ptr, m_ptr, p_ptr, v_ptr, x_ptr = _ptrs(row, DT, READS, ALIGNED)
    if DIRECTION == NS_OUT:  # Newton-Schulz's stack slice (written only)
        out = _ptr(row, C_OUT, OUT_DT, ALIGNED)
    g, ref, m, p, v, x = _loads(g_ptr, ref_ptr, m_ptr, p_ptr, v_ptr, x_ptr, offs, mask, READS,
                                MASKED)  # fmt: skip
    if GSCALE:
        g = g * tl.load(gscale)
    c = g
    if REDUCE:
        c = g + kappa * (g - ref)
        if CLIP == CLIP_TENSOR:
            c = c * tl.load(divisors + t)
        if CLIP == CLIP_GLOBAL:
            c = _div(c, tl.load(divisors))
        if COPY_REF:
            _st(ref_ptr, offs, g, mask, MASKED)
    if MOMENTUM == EMA:  # ema: m = beta * m + (1 - beta) * c, as mul then add
        m = m * beta + m_add * c
        u = m
    if MOMENTUM == EMA_LERP:  # ema-lerp
        m = _lerp(m, c, m_add)
        u = m
    if MOMENTUM == LION:  # lion: u = lerp(c, m, beta1); m = lerp(m, c, 1 - beta2)
        u = _lerp(c, m, lion_u)
        m = _lerp(m, c, lion_m)
    if MOMENTUM == HEAVY_BALL:  # heavy-ball: buf = mu * buf + g; u = buf
        m = m * beta + c
        u = m
    if MOMENTUM == HEAVY_NESTEROV:  # heavy-ball, Nesterov: u = mu * buf + g
        m = m * beta + c
        u = m * beta + c
    if MOMENTUM == ONE_BUFFER:  # one-buffer: buf = mu * buf + phi * g; u = gamma * g + mu * buf
        m = m * beta + m_add * c
        u = c * mix + m * beta
    if FIRST:  # SOAP's first step: the basis only, the momentum back to zero, no update
        _st(m_ptr, offs, m * 0.0, mask, MASKED)
    else:
        _st(m_ptr, offs, m, mask, MASKED)
        if DIRECTION == NS_OUT:  # Newton-Schulz's input, into its stack: u / divisor in NS's dtype
            _st(out, at, _narrow(_div(u, bc1), OUT_DT), mask, MASKED)
        else:
            _direction(p_ptr, v_ptr, x_ptr, offs, mask, c, g, u, p, v, x, b2, v_add, keep,
                       neg_size, bc2s, bc1, eps, mix, b3, s_add, DIRECTION, AMSGRAD, SRC_C,
                       MASKED)  # fmt: skip


@triton.jit
def _ptrs(row, DT: tl.constexpr, READS: tl.constexpr, ALIGNED: tl.constexpr):
    """The addresses of every stream a ``step_kernel`` block touches, read from the table once:
    g's, the momentum's and each column of ``READS`` (a stream the rule does not touch: ``g``'s,
    never loaded or stored)."""
    g = _ptr(row, C_G, DT, ALIGNED)
    ref = _addr(row, C_REF, g, DT, READS, ALIGNED)
    m = _ptr(row, C_M, DT, ALIGNED)
    p = _addr(row, C_P, g, DT, READS, ALIGNED)
    v = _addr(row, C_V, g, DT, READS, ALIGNED)
    x = _addr(row, C_X, g, DT, READS, ALIGNED)
    return g, ref, m, p, v, x


@triton.jit
def _addr(row, COL: tl.constexpr, g, DT: tl.constexpr, READS: tl.constexpr,
          ALIGNED: tl.constexpr):  # fmt: skip
    """Column ``COL``'s address where ``READS`` has it, else ``g``'s."""
    if READS >> COL & 1:
        return _ptr(row, COL, DT, ALIGNED)
    else:
        return g


@triton.jit
def _loads(g_ptr, ref_ptr, m_ptr, p_ptr, v_ptr, x_ptr, offs, mask, READS: tl.constexpr,
           MASKED: tl.constexpr):  # fmt: skip
    """Every stream a ``step_kernel`` block reads: ``g``, the momentum and the columns of
    ``READS`` (``g_ref``; ``p``, ``v`` and the extra state: v_max, AdEMAMix's slow EMA); a stream
    the rule does not read is ``g`` (a name only: nothing loaded)."""
    g = _ld(g_ptr, offs, mask, MASKED)
    ref = _ld_if(ref_ptr, offs, mask, g, C_REF, READS, MASKED)
    m = _ld(m_ptr, offs, mask, MASKED)
    p = _ld_if(p_ptr, offs, mask, g, C_P, READS, MASKED)
    v = _ld_if(v_ptr, offs, mask, g, C_V, READS, MASKED)
    x = _ld_if(x_ptr, offs, mask, g, C_X, READS, MASKED)
    return g, ref, m, p, v, x


@triton.jit
def _ld_if(ptr, offs, mask, g, COL: tl.constexpr, READS: tl.constexpr, MASKED: tl.constexpr):
    """Column ``COL``'s stream where ``READS`` has it, else ``g``."""
    if READS >> COL & 1:
        return _ld(ptr, offs, mask, MASKED)
    else:
        return g


@triton.jit
def _direction(p_ptr, v_ptr, x_ptr, offs, mask, c, g, u, p, v, x, b2, v_add, keep, neg_size,
               bc2s, bc1, eps, mix, b3, s_add, DIRECTION: tl.constexpr, AMSGRAD: tl.constexpr,
               SRC_C: tl.constexpr, MASKED: tl.constexpr):  # fmt: skip
    """The preconditioner's direction and ``p = p * keep - size * d`` (foreach's op order), on
    the loaded ``p``, ``v`` and ``x``; stores them."""
    p = p * keep
    if DIRECTION == SIGN:
        d = tl.where(u > 0, 1.0, tl.where(u < 0, -1.0, u * 0.0))
        p = p + neg_size * d
    else:
        if SRC_C:
            s = c
        else:
            s = g
        if DIRECTION == ADAM_LERP:  # v.lerp_(s * s, 1 - beta2)
            v = _lerp(v, s * s, v_add)
        elif DIRECTION == SOAP_ADAM:  # v * beta2 + (1 - beta2) * s^2
            v = v * b2 + v_add * (s * s)
        else:  # addcmul: v * beta2 + ((1 - beta2) * s) * s
            v = v * b2 + v_add * s * s
        _st(v_ptr, offs, v, mask, MASKED)
        if AMSGRAD:
            v = tl.maximum(x, v)
            _st(x_ptr, offs, v, mask, MASKED)
        root = _sqrt(v)
        if DIRECTION == ADAM:  # MARS: ((sqrt(v) / sqrt(1 - beta2^t)) + eps) * (1 - beta1^t)
            p = p + _div(neg_size * u, (_div(root, bc2s) + eps) * bc1)
        elif DIRECTION == ADAM_LERP:  # Moonlight / MARS-M / the MARS repo's AdamW
            p = p + _div(neg_size * u, root + eps)
        elif DIRECTION == SOAP_ADAM:  # SOAP's Adam on an unrotated tensor
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
    _, t, j, row = _program(table, blocks)
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
    _, t, j, row = _program(table, blocks)
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
