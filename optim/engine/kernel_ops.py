"""The engine kernels' device helpers and named codes (optim/engine/kernels.py, norm_kernels.py).

Executed through optim/engine/loader.py in the mode a device needs, as the kernel modules are
(never imported directly): the table's columns and the rules' codes of optim/engine/layout.py as
constants a kernel may read, the table of the state each direction reads (``STATE``), and the
small ``triton.jit`` helpers every kernel shares: IEEE arithmetic as torch's, bf16 rounding on the
bits, a table row's addresses and sizes, masked and unmasked loads and stores.
"""

from __future__ import annotations

import triton
import triton.language as tl

from optim.engine import layout


def _constexprs(names: str) -> tuple:
    """optim/engine/layout.py's ``names`` as ``tl.constexpr``s (a kernel reads no other global)."""
    return tuple(tl.constexpr(getattr(layout, n)) for n in names.split())


# the table's columns (a row per tensor: optim/engine/tables.py)
C_P, C_G, C_REF, C_M, C_V, C_X, C_OUT, C_NUMEL, C_FIRST, C_NBLK, C_TCOLS, NCOLS = _constexprs(
    "C_P C_G C_REF C_M C_V C_X C_OUT C_NUMEL C_FIRST C_NBLK C_TCOLS NCOLS"
)
# step_kernel's MOMENTUM, DIRECTION and CLIP (optim/engine/rules.py ``Kind``)
EMA, EMA_LERP, LION, HEAVY_BALL, HEAVY_NESTEROV, ONE_BUFFER = _constexprs(
    "EMA EMA_LERP LION HEAVY_BALL HEAVY_NESTEROV ONE_BUFFER"
)
ADAM, ADAM_LERP, SIGN, ADEMAMIX, SOAP_ADAM, NS_OUT = _constexprs(
    "ADAM ADAM_LERP SIGN ADEMAMIX SOAP_ADAM NS_OUT"
)
CLIP_TENSOR, CLIP_GLOBAL = _constexprs("CLIP_TENSOR CLIP_GLOBAL")
# layout.STATE, the state each direction reads beside g, g_ref and the momentum, as one int
# read at compile time: direction d's columns are its bits ``d * NCOLS + column``
STATE = tl.constexpr(layout.STATE_BITS)
# the columns step_kernel reads beside a direction's state, as bits: the MARS correction's g_ref,
# amsgrad's v_max (a constexpr on the left of each bit operator: the interpreter passes a
# kernel's flags as plain Python values, and ``tl.constexpr`` has no reflected ``<<`` or ``|``)
REF_BIT, X_BIT = (tl.constexpr(1 << c) for c in (layout.C_REF, layout.C_X))


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
def _program(table, blocks):
    """This program's number, its tensor ``t``, its block ``j`` of that tensor (the ``blocks``
    pair) and the tensor's table row."""
    pid = tl.program_id(0)
    t = tl.load(blocks + 2 * pid).to(tl.int64)
    j = tl.load(blocks + 2 * pid + 1).to(tl.int64)
    return pid, t, j, table + t * NCOLS


@triton.jit
def _ld_block(ptr, offs, n, whole):
    """A block of ``n`` elements' stream, masked unless ``whole`` (decided at run time)."""
    if whole:
        x = tl.load(ptr + offs)
    else:
        x = tl.load(ptr + offs, mask=offs < n, other=0.0)
    return x


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
def _tile(j, rows, cols, BLOCK: tl.constexpr, TILE: tl.constexpr):
    """Row and column indices (``(TILE, 1)`` and ``(1, BLOCK // TILE)``) of tile ``j`` of a
    ``(rows, cols)`` matrix, the tiles row-major (``layout.tiles`` counts them)."""
    across = (cols + BLOCK // TILE - 1) // (BLOCK // TILE)
    i = (j // across) * TILE + tl.arange(0, TILE)[:, None]
    k = (j % across) * (BLOCK // TILE) + tl.arange(0, BLOCK // TILE)[None, :]
    return i, k
