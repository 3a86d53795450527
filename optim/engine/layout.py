"""The engine's table layout and rule codes, shared by the host code and the kernels (plain
ints here: this module imports nothing, so the host side needs no Triton to build a plan)."""

# columns of a tensor's row in the pointer table: addresses of its parameter, gradient,
# reference gradient, momentum, second moment, extra state (v_max, AdEMAMix's slow EMA) and
# Newton-Schulz stack slice; its number of elements, first block and number of blocks; and
# ``C_TCOLS``: 0, or a tall matrix's number of columns where its Newton-Schulz slice holds it
# transposed (its element (i, j) at j * rows + i: optim/engine/ns.py); such a row's blocks are
# tiles (``tiles``)
C_P, C_G, C_REF, C_M, C_V, C_X, C_OUT, C_NUMEL, C_FIRST, C_NBLK, C_TCOLS = range(11)
NCOLS = 11
ADDRESS_COLS = (C_P, C_G, C_REF, C_M, C_V, C_X, C_OUT)
# momentum forms (the kernel's MOMENTUM)
EMA, EMA_LERP, LION, HEAVY_BALL, HEAVY_NESTEROV, ONE_BUFFER = range(6)
# directions (DIRECTION)
ADAM, ADAM_LERP, SIGN, ADEMAMIX, SOAP_ADAM, NS_OUT = range(6)
# clip scopes (CLIP)
CLIP_NONE, CLIP_TENSOR, CLIP_GLOBAL = range(3)
# The state each direction's update reads and writes beside g, g_ref (the MARS correction's) and
# the momentum, by column: the one table of the host's plan columns (optim/engine/launch.py
# ``columns``) and of step_kernel's streams (optim/engine/kernels.py ``_ptrs``, ``_loads``).
# NS_OUT writes its stack slice (C_OUT) only; amsgrad adds v_max (C_X); SOAP's first step
# reads none (the kernel's FIRST).
STATE = {
    ADAM: (C_P, C_V),
    ADAM_LERP: (C_P, C_V),
    SIGN: (C_P,),
    ADEMAMIX: (C_P, C_V, C_X),  # C_X: the slow EMA
    SOAP_ADAM: (C_P, C_V),
    NS_OUT: (),
}
# the table as one int the kernels read at compile time: direction d's columns at the bits
# ``d * NCOLS + column``
STATE_BITS = sum(1 << (d * NCOLS + c) for d, cols in STATE.items() for c in cols)


def tile_rows(block: int) -> int:
    """Rows of the ``(rows, block // rows)`` tiles of a transposed Newton-Schulz slice (square
    where ``block``, a power of two, is a power of four: 64 x 64 at 4096, 32 x 64 at 2048)."""
    return 1 << ((block.bit_length() - 1) // 2)


def tiles(rows: int, cols: int, block: int) -> int:
    """How many tiles of ``block`` elements cover a ``(rows, cols)`` matrix."""
    tr = tile_rows(block)
    return -(-rows // tr) * -(-cols // (block // tr))
