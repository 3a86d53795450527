"""The engine's update kernel for an sm_90 GPU, compiled on this machine (no GPU needed): the
registers a thread each candidate block size takes and the CTAs an SM then holds.

    python -m bench.occupancy                       # the candidates, a table
    python -m bench.occupancy --out bench/records   # and the record (kind "occupancy")

Triton compiles ``step_kernel`` (optim/engine/kernels.py) to an sm_90 cubin without a driver;
Triton's own ``cuobjdump -res-usage`` reads its registers. CTAs per SM from the registers alone
(``ctas_per_sm``: the kernel uses no shared memory unless tiled): H100 and H200 have 65,536
registers and 64 warps an SM, at most 32 CTAs, registers given to a warp in units of 256. A
kernel that holds one CTA an SM has nothing to run while that CTA waits on memory; the GPU check
times the candidates (bench.optim_fused --block) so that the default is chosen from records.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from pathlib import Path

# sm_90 (H100, H200): per SM
REGISTERS, MAX_WARPS, MAX_CTAS, REG_UNIT, SHARED = 65536, 64, 32, 256, 228 * 1024
CANDIDATES = ((4096, 8), (2048, 8), (2048, 4), (1024, 4))  # (block, warps)


def ctas_per_sm(registers: int, warps: int, shared: int = 0) -> int:
    """CTAs of ``warps`` warps, each thread holding ``registers``, that one sm_90 SM holds."""
    per_warp = -(-registers * 32 // REG_UNIT) * REG_UNIT
    by_regs = (REGISTERS // per_warp) // warps
    by_shared = SHARED // shared if shared else MAX_CTAS
    return min(by_regs, MAX_WARPS // warps, MAX_CTAS, by_shared)


def variants() -> dict[str, dict]:
    """The update kernel's constexprs for the families the figures name (rules.py's codes)."""
    from optim.engine import layout as L

    base = dict(CLIP=0, COPY_REF=False, AMSGRAD=False, SRC_C=True, FIRST=False, HAS_SKIP=False,
                ALIGNED=True, GSCALE=True, STRIDED=False, REDUCE=False)  # fmt: skip
    return {
        "mars-adamw": {
            **base,
            "REDUCE": True,
            "CLIP": L.CLIP_TENSOR,
            "COPY_REF": True,
            "MOMENTUM": L.EMA,
            "DIRECTION": L.ADAM,
        },  # fmt: skip
        "lion": {**base, "MOMENTUM": L.LION, "DIRECTION": L.SIGN},
        "adamw (adam-lerp)": {**base, "MOMENTUM": L.EMA_LERP, "DIRECTION": L.ADAM_LERP},
        "muon pre-pass (tiled)": {
            **base,
            "MOMENTUM": L.HEAVY_NESTEROV,
            "DIRECTION": L.NS_OUT,
            "STRIDED": True,
        },  # fmt: skip
    }


def compile_sm90(consts: dict, block: int, warps: int) -> dict:
    """``step_kernel`` compiled for sm_90 at ``block``/``warps``: registers, shared bytes."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from optim.engine import layout as L
    from optim.engine import loader

    scalars = "kappa beta m_add lion_u lion_m b2 v_add keep neg_size bc2s bc1 eps mix b3 s_add"
    sig = {"table": "*i64", "blocks": "*i32", "divisors": "*fp32", "skip": "*u8",
           "gscale": "*fp32", **dict.fromkeys(scalars.split(), "fp32")}  # fmt: skip
    consts = dict(consts, DT=tl.float32, OUT_DT=tl.bfloat16, BLOCK=block, TILE=L.tile_rows(block))
    src = ASTSource(fn=loader.kernels("jit").step_kernel, constexprs=consts,
                    signature={**sig, **dict.fromkeys(consts, "constexpr")})  # fmt: skip
    options = {"num_warps": warps, "enable_fp_fusion": loader.FP_FUSION}
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True,
                             check=True).stdout  # fmt: skip
    regs = int(re.search(r"REG:(\d+)", out).group(1))
    shared = int(kernel.metadata.shared)
    return {"registers": regs, "shared_bytes": shared,
            "ctas_per_sm": ctas_per_sm(regs, warps, shared)}  # fmt: skip


def measure(candidates=CANDIDATES, names: list[str] | None = None) -> list[dict]:
    out = []
    for name, consts in variants().items():
        if names and name not in names:
            continue
        for block, warps in candidates:
            out.append({"variant": name, "block": block, "warps": warps,
                        **compile_sm90(consts, block, warps)})  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default=None, help="a directory or .json file: the record")
    args = ap.parse_args()
    rows = measure()
    for r in rows:
        print(f"{r['variant']:<24} block {r['block']:>5} / {r['warps']} warps: "
              f"{r['registers']:>4} registers, {r['shared_bytes']:>6} B shared, "
              f"{r['ctas_per_sm']} CTAs per SM", flush=True)  # fmt: skip
    if args.out:
        from bench import record
        from optim.engine import launch

        path = record.measurement(args.out, "occupancy", "cpu", rounds=[], unit="registers",
                                  target="sm_90 (H100, H200)", candidates=rows,
                                  default_block=launch.DEFAULT_BLOCK)  # fmt: skip
        print("record:", path)


if __name__ == "__main__":
    main()
