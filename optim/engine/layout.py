"""The engine's table layout and rule codes, shared by the host code and the kernels (plain
ints here: this module imports nothing, so the host side needs no Triton to build a plan)."""

# columns of a tensor's row in the pointer table: addresses of its parameter, gradient,
# reference gradient, momentum, second moment, extra state (v_max, AdEMAMix's slow EMA) and
# Newton-Schulz stack slice; its number of elements, first block and number of blocks
C_P, C_G, C_REF, C_M, C_V, C_X, C_OUT, C_NUMEL, C_FIRST, C_NBLK = range(10)
NCOLS = 10
ADDRESS_COLS = (C_P, C_G, C_REF, C_M, C_V, C_X, C_OUT)
# momentum forms (the kernel's MOMENTUM)
EMA, EMA_LERP, LION, HEAVY_BALL, HEAVY_NESTEROV, ONE_BUFFER = range(6)
# directions (DIRECTION)
ADAM, ADAM_LERP, SIGN, ADEMAMIX, SOAP_ADAM, NS_OUT = range(6)
# clip scopes (CLIP)
CLIP_NONE, CLIP_TENSOR, CLIP_GLOBAL = range(3)
