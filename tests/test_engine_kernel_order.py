"""The update pass loads every stream before it stores any (issue 53's kernel item): checked on
the Triton IR of ``step_kernel`` for an sm_90 target after inlining (no GPU needed), in the
variants the families use. A load after a store waits on that store's memory traffic in series;
loaded together, a block's loads are in flight at once."""

import pytest

pytest.importorskip("triton")

from optim.engine import layout as L  # noqa: E402
from optim.engine import loader  # noqa: E402

pytestmark = pytest.mark.engine
SCALARS = "kappa beta m_add lion_u lion_m b2 v_add keep neg_size bc2s bc1 eps mix b3 s_add"


def ttir(fn, sig: dict, consts: dict) -> str | None:
    """``fn``'s Triton IR after Triton's own first passes (inlining among them), or None where
    this Triton's compiler internals differ."""
    try:
        from triton._C.libtriton import ir
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from triton.compiler.compiler import make_backend

        target = GPUTarget("cuda", 90, 32)
        backend = make_backend(target)
        options = backend.parse_options({"enable_fp_fusion": True})
        context = ir.context()
        ir.load_dialects(context)
        backend.load_dialects(context)
        src = ASTSource(fn=fn, signature={**sig, **dict.fromkeys(consts, "constexpr")},
                        constexprs=consts)  # fmt: skip
        mod = src.make_ir(target, options, backend.get_codegen_implementation(options),
                          backend.get_module_map(), context)  # fmt: skip
        stages: dict = {}
        backend.add_stages(stages, options, src.language)
        return str(stages["ttir"](mod, {}))
    except Exception:  # noqa: BLE001 (another Triton: the check is skipped, not failed)
        return None


def loads_after_stores(text: str) -> list[str]:
    """The ``tt.load`` lines that follow a ``tt.store`` within one branch of the kernel."""
    late, stored = [], False
    for line in text.splitlines():
        if "} else {" in line or "scf.if" in line:
            stored = False  # another branch (whole block, masked block, tile)
        elif "tt.store" in line:
            stored = True
        elif "tt.load" in line and stored:
            late.append(line.strip())
    return late


RULES = {  # name -> (momentum, direction, clip, amsgrad, strided)
    "mars-adamw": (L.EMA, L.ADAM, L.CLIP_TENSOR, False, False),
    "mars-adamw-amsgrad-global": (L.EMA, L.ADAM, L.CLIP_GLOBAL, True, False),
    "adam-lerp": (L.EMA_LERP, L.ADAM_LERP, L.CLIP_NONE, False, False),
    "lion": (L.LION, L.SIGN, L.CLIP_NONE, False, False),
    "ademamix": (L.EMA, L.ADEMAMIX, L.CLIP_NONE, False, False),
    "mars-m-ns-prepass": (L.EMA, L.NS_OUT, L.CLIP_TENSOR, False, True),
}


@pytest.mark.parametrize("name", list(RULES))
def test_step_kernel_loads_every_stream_before_any_store(name):
    import triton.language as tl

    momentum, direction, clip, amsgrad, strided = RULES[name]
    sig = {"table": "*i64", "blocks": "*i32", "divisors": "*fp32", "skip": "*u8",
           "gscale": "*fp32", **dict.fromkeys(SCALARS.split(), "fp32")}  # fmt: skip
    consts = dict(DT=tl.float32, OUT_DT=tl.bfloat16, BLOCK=4096, REDUCE=clip > 0, CLIP=clip,
                  COPY_REF=clip > 0, MOMENTUM=momentum, DIRECTION=direction, AMSGRAD=amsgrad,
                  SRC_C=True, FIRST=False, HAS_SKIP=False, ALIGNED=True, GSCALE=True,
                  STRIDED=strided, TILE=64)  # fmt: skip
    text = ttir(loader.kernels("jit").step_kernel, sig, consts)
    if text is None:
        pytest.skip("this Triton's compiler internals differ (make_ir, add_stages)")
    assert text.count("tt.store") and text.count("tt.load")
    assert loads_after_stores(text) == [], name
