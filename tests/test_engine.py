"""The Triton optimizer engine (optim/engine/) against the foreach path, on the CPU.

The kernels run under Triton's interpreter: ``implementation="triton"`` forces the engine on any device,
and for CPU tensors optim/engine/loader.py executes the kernel module with ``TRITON_INTERPRET=1``
set while ``triton.jit`` decorates it (Triton reads the variable then, not at launch), so no
environment variable is needed here and the process's other Triton users stay compiled. The
interpreter keeps float64 (scalar arguments included), so every comparison is in float64 at
1e-12. Tiny tensors, 16-element blocks (every tensor spans several programs), a few steps: the
module takes seconds. Skipped without triton.
"""

import copy
import importlib
import logging
import sys

import pytest
import torch

pytest.importorskip("triton")

import optim  # noqa: E402
from optim import MARS, MARS_M, Lion, MARS_M_Efficient, Moonlight, Muon, VarianceReduced  # noqa: E402
from optim.ademamix import AdEMAMixOptions  # noqa: E402
from optim.engine import launch, loader  # noqa: E402
from optim.rule import Rule, VarianceReduction  # noqa: E402
from optim.soap import SoapOptions  # noqa: E402

pytestmark = pytest.mark.engine
SHAPES = [(6, 7), (3, 11), (9,)]
LRS = [1e-2, 3e-3, 2e-2, 5e-3]  # a new lr every step: scalar arguments, no recompile
SCALES = [0.05, 3.0, 0.3, 2.0]  # gradient sizes: the clip fires on some steps, not on others
TOL = dict(rtol=1e-12, atol=1e-14)


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setitem(launch.BLOCKS, "cpu", 16)
    monkeypatch.setitem(launch.CHUNK, "cpu", 2)  # a tensor's partial sums: several chunks


def make_params(shapes=SHAPES):
    gen = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(s, generator=gen, dtype=torch.float64)) for s in shapes]


def set_grads(params, t, salt=0):
    gen = torch.Generator().manual_seed(100 + t + salt)
    for p in params:
        g = torch.randn(p.shape, generator=gen, dtype=p.dtype) * SCALES[t % len(SCALES)]
        p.grad = g.to(p.device)


def run(opt, params, steps, start=0):
    for t in range(start, start + steps):
        for group in opt.param_groups:
            group["lr"] = LRS[t % len(LRS)]
        if getattr(opt, "needs_reference_grad", False):
            set_grads(params, t, salt=1000)
            opt.store_reference_grad()
        set_grads(params, t)
        opt.step()


def assert_same(pa, oa, pb, ob, tol=TOL):
    for a, b in zip(pa, pb):
        torch.testing.assert_close(a, b, **tol)
        for k, v in oa.state[a].items():
            w = ob.state[b][k]
            if torch.is_tensor(v):
                torch.testing.assert_close(v, w, **tol, msg=k)
            else:
                assert v == w, k


def split(params):
    return dict(muon_params=[p for p in params if p.ndim == 2],
                adamw_params=[p for p in params if p.ndim != 2])  # fmt: skip


def core(preconditioner, options=None, vr=None, **group):
    """A core optimizer over one group with the given rule (EMA momentum)."""
    keys = Rule(momentum="ema", preconditioner=preconditioner, options=options,
                variance_reduction=vr).group_keys()  # fmt: skip
    return lambda p, how: VarianceReduced(
        [dict(params=p, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1, **keys, **group)],
        implementation=how,
    )


VR = VarianceReduction(0.025, "tensor", "zero")
CASES = {
    "mars-adamw": lambda p, f: MARS(p, lr=1e-2, weight_decay=0.1, implementation=f),
    "mars-adamw-exact-global-amsgrad": lambda p, f: MARS(p, weight_decay=0.1, is_approx=False,
                                                         clip="global", amsgrad=True, implementation=f),
    "mars-adamw-plain-g-noclip": lambda p, f: MARS(p, first_step="plain", second_moment="g",
                                                   clip="none", optimize_1d=True, implementation=f),
    "mars-lion": lambda p, f: MARS(p, mars_type="mars-lion", weight_decay=0.1, implementation=f),
    "mars-lion-exact": lambda p, f: MARS(p, mars_type="mars-lion", is_approx=False, implementation=f),
    "lion": lambda p, f: Lion(p, weight_decay=0.3, implementation=f),
    "mars-shampoo": lambda p, f: MARS(p, mars_type="mars-shampoo", ns_dtype="param", implementation=f),
    "muon": lambda p, f: Muon(p, weight_decay=0.1, ns_dtype="param", implementation=f),
    "moonlight": lambda p, f: Moonlight(**split(p), ns_dtype="param", implementation=f),
    "mars-m": lambda p, f: MARS_M(**split(p), ns_dtype="param", implementation=f),
    "mars-m-exact-global": lambda p, f: MARS_M(**split(p), ns_dtype="param", is_approx=False,
                                                clip="global", implementation=f),
    "mars-m-efficient": lambda p, f: MARS_M_Efficient(**split(p), ns_dtype="param", implementation=f),
    "ademamix-warmups": core("ademamix", AdEMAMixOptions(alpha_warmup=3, beta3_warmup=3)),
    "mars-ademamix": core("ademamix", AdEMAMixOptions(), VR),
    "adam-before-bias-correction": core("adam", optim.preconditioners.AdamOptions(
        eps_placement="before_bias_correction", decay_bias_corrected=True)),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_engine_step_equals_foreach(name):
    """Four steps with a changing lr, gradients whose clip fires on some steps, decay: the same
    parameters and state as the foreach path; every bucket ran on the engine."""
    make = CASES[name]
    ref_p, eng_p = make_params(), make_params()
    ref, eng = make(ref_p, "foreach"), make(eng_p, "triton")
    run(ref, ref_p, 4), run(eng, eng_p, 4)
    assert eng.off_reason is None
    assert set(eng.route_counts) == {"engine"} and eng.route_counts["engine"] == 4 * len(
        eng.last_routes)  # fmt: skip
    assert_same(ref_p, ref, eng_p, eng)


def test_soap_takes_its_unrotated_tensors_to_the_engine():
    """SOAP's 1-D tensors (plain Adam in SOAP's arithmetic, the first step without an update)
    on the engine, its rotated matrices on foreach: the same numbers as all on foreach."""
    make = core("soap", SoapOptions(precondition_frequency=2))
    ref_p, eng_p = make_params(), make_params()
    ref, eng = make(ref_p, "foreach"), make(eng_p, "triton")
    run(ref, ref_p, 4), run(eng, eng_p, 4)
    assert eng.route_counts == {"engine": 4, "foreach": 4}
    assert_same(ref_p, ref, eng_p, eng)


def test_newton_schulz_in_bf16_on_persistent_stacks():
    """NS in its default bf16: the pre-pass writes u into the stack as the foreach path's cast
    does, so the updates agree to bf16's rounding; the stacks are allocated once."""
    ref_p, eng_p = make_params(), make_params()
    ref, eng = (
        MARS_M(**split(ref_p), implementation="foreach"),
        MARS_M(**split(eng_p), implementation="triton"),
    )
    run(ref, ref_p, 3), run(eng, eng_p, 3)
    assert_same(ref_p, ref, eng_p, eng, tol=dict(rtol=1e-6, atol=1e-9))
    stacks = [
        s.stack
        for plan in eng.engine_state.cache.plans.values()
        for s in getattr(plan, "stacks", [])
    ]  # fmt: skip  (new gradients each step: one set)
    assert {s.dtype for s in stacks} == {torch.bfloat16} and len(stacks) == 2


@pytest.mark.parametrize("name", ["mars-adamw", "mars-adamw-exact-global-amsgrad", "mars-m"])
def test_skipped_nonfinite_step_changes_nothing(name):
    """A step flagged non-finite on the device (``found_inf``, torch's grad-scaler protocol)
    writes nothing: the run then equals one that never saw that step."""
    make = CASES[name]
    ref_p, eng_p = make_params(), make_params()
    ref, eng = make(ref_p, "foreach"), make(eng_p, "triton")
    run(ref, ref_p, 2), run(eng, eng_p, 2)
    before = copy.deepcopy(eng.state_dict()), [p.detach().clone() for p in eng_p]
    if eng.needs_reference_grad:
        set_grads(eng_p, 9)
        eng.store_reference_grad()
    for p in eng_p:
        p.grad = torch.full_like(p, float("nan"))
    eng.found_inf = torch.ones(())
    eng.step()
    eng.uncount_last_step()
    eng.found_inf = torch.zeros(())
    for p, q in zip(eng_p, before[1]):
        assert torch.equal(p, q)
    for i, state in eng.state_dict()["state"].items():  # exact mode: a new stored reference
        old = {k: v for k, v in before[0]["state"][i].items() if k != "previous_grad"}
        torch.testing.assert_close({k: state[k] for k in old}, old, rtol=0, atol=0)
    run(ref, ref_p, 2, start=2), run(eng, eng_p, 2, start=2)
    assert_same(ref_p, ref, eng_p, eng)
    assert set(eng.route_counts) == {"engine"}


def test_schedulefree_engine_equals_foreach_and_records_its_path():
    ref_p, eng_p = make_params(), make_params()
    ref = optim.AdamWScheduleFree(ref_p, lr=1e-2, weight_decay=0.1, warmup_steps=2)
    eng = optim.AdamWScheduleFree(eng_p, lr=1e-2, weight_decay=0.1, warmup_steps=2,
                                  implementation="triton")  # fmt: skip
    run(ref, ref_p, 4), run(eng, eng_p, 4)
    assert ref.route_counts == {"foreach": 4} and eng.route_counts == {"engine": 4}
    assert eng.off_reason is None
    assert_same(ref_p, ref, eng_p, eng)
    ref.eval(), eng.eval()  # x, the averaged weights
    for a, b in zip(ref_p, eng_p):
        torch.testing.assert_close(a, b, **TOL)


def test_state_dicts_swap_between_engine_and_foreach_and_plans_are_reused():
    ref_p, eng_p = make_params(), make_params()
    ref, eng = MARS(ref_p, weight_decay=0.1, implementation="foreach"), MARS(eng_p, weight_decay=0.1,
                                                                implementation="triton")  # fmt: skip
    run(ref, ref_p, 2), run(eng, eng_p, 2)
    other_p = [p.detach().clone().requires_grad_() for p in ref_p]
    other = MARS(other_p, weight_decay=0.1, implementation="triton")
    other.load_state_dict(copy.deepcopy(ref.state_dict()))  # foreach -> engine
    back_p = [p.detach().clone().requires_grad_() for p in eng_p]
    back = MARS(back_p, weight_decay=0.1, implementation="foreach")
    back.load_state_dict(copy.deepcopy(eng.state_dict()))  # engine -> foreach
    for opt, ps in ((ref, ref_p), (eng, eng_p), (other, other_p), (back, back_p)):
        run(opt, ps, 2, start=2)
    assert_same(ref_p, ref, other_p, other)
    assert_same(ref_p, ref, back_p, back)
    assert_same(ref_p, ref, eng_p, eng)
    built = eng.engine_state.cache.built
    for _ in range(2):  # the same gradient tensors, new values: no new plan
        for p, g in zip(eng_p, [torch.randn_like(p) for p in eng_p]):
            p.grad.copy_(g)
        eng.step()
    assert eng.engine_state.cache.built == built


class Tiny(torch.nn.Module):
    """Every parameter kind of optim/groups.py but the head, in a few hundred numbers."""

    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(10, 6)
        self.fc = torch.nn.Linear(6, 9)
        self.ln = torch.nn.LayerNorm(9)
        self.proj = torch.nn.Linear(9, 6, bias=False)


@pytest.mark.parametrize("name", ["mars-adamw", "lion", "muon", "ademamix"])
def test_registry_configs_with_decay_kinds(name):
    """The registry's builders (decay on matrices and embeddings, MARS's non-2-D AdamW with its
    own decay, Muon's bias-scaled AdamW decay): engine equals foreach, every bucket engine."""
    models = [Tiny().double() for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    cls = optim.get_spec(name).config_cls
    cfg = cls(**({"decay_kinds": ["matrix", "embedding"]} if name != "muon" else
                 {"weight_decay": 0.1, "ns_dtype": "float64"}))  # fmt: skip
    ref, eng = (optim.build_optimizer(m, cfg) for m in models)
    ref.implementation, eng.implementation = "foreach", "triton"
    ps = [list(m.parameters()) for m in models]
    run(ref, ps[0], 3), run(eng, ps[1], 3)
    assert set(eng.route_counts) == {"engine"}
    assert_same(ps[0], ref, ps[1], eng)


def test_the_conformance_vectors_pass_on_the_engine(monkeypatch):
    """The official trajectories (optim/conformance) through the engine: MARS-AdamW and
    MARS-Lion, approx and exact, in float64 at 1e-10. (The Newton-Schulz vectors take seconds
    each in bf16 on a CPU; the engine equals the foreach path on their rules above, in float64,
    and the foreach path passes them: tests/test_conformance.py.)"""
    from optim.conformance import make_dropin, run_vector, select

    monkeypatch.setitem(launch.BLOCKS, "cpu", 1024)  # one program per tensor: fewer launches
    for entry in select(["mars-adamw-*", "mars-lion-*"]):
        engine_cls = type("MARS", (MARS,), {"__init__": _forced(MARS)})
        result = run_vector(make_dropin(engine_cls), entry)
        assert result.passed, result


def _forced(cls):
    def __init__(self, *args, **kwargs):
        cls.__init__(self, *args, implementation="triton", **kwargs)

    return __init__


def test_without_triton_the_engine_falls_back_with_its_reason(monkeypatch, caplog):
    monkeypatch.setattr(loader, "triton_missing", lambda: "triton is not importable (test)")
    ps = make_params()
    opt = MARS(ps, implementation="triton")
    with caplog.at_level(logging.WARNING, logger="optim.engine"):
        run(opt, ps, 2)
    assert opt.route_counts == {"foreach": 4} and "test" in opt.off_reason
    assert "triton is not importable (test)" in caplog.text


def test_cpu_default_is_unchanged():
    ps = make_params()
    opt = MARS(ps)
    run(opt, ps, 1)
    assert set(opt.route_counts) == {"foreach"} and opt.engine_state.cache.built == 0
    with pytest.raises(ValueError, match="'engine'"):
        MARS(ps, implementation="engine")


def test_optim_imports_and_steps_without_triton(monkeypatch):
    """optim/ needs torch only: imported afresh with triton unimportable, it imports without
    importing triton, and implementation="triton" runs on foreach, saying why (the modules of this
    process are put back afterwards)."""
    saved = {n: m for n, m in sys.modules.items() if n == "optim" or n.startswith("optim.")}
    for name in [*saved, "triton"]:
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton raises ImportError
    try:
        fresh = importlib.import_module("optim")
        p = torch.nn.Parameter(torch.ones(3))
        p.grad = torch.ones(3)
        opt = fresh.MARS([p], implementation="triton")
        opt.step()
        assert opt.route_counts == {"foreach": 1}, opt.route_counts
        assert "triton is not importable" in opt.off_reason
    finally:
        for name in [n for n in sys.modules if n == "optim" or n.startswith("optim.")]:
            del sys.modules[name]
        sys.modules.update(saved)


GPU_CASES = ["mars-adamw", "mars-adamw-exact-global-amsgrad", "mars-lion", "lion", "muon",
             "mars-m", "ademamix-warmups", "adam-before-bias-correction"]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", GPU_CASES)
def test_engine_equals_foreach_on_cuda(name, monkeypatch):
    """The compiled kernels on the GPU, float32: whole blocks (vectorised) and tails, a skipped
    step, the same numbers as the foreach path to float32 rounding (the GPU contracts
    multiply-adds; Newton-Schulz in float32 here, the batches differing by shape merging)."""
    monkeypatch.setitem(launch.BLOCKS, "cuda", 1024)
    shapes = [(64, 130), (33, 70), (4097,)]

    def cuda_params():
        return [torch.nn.Parameter(p.detach().float().cuda()) for p in make_params(shapes)]

    ref_p, eng_p = cuda_params(), cuda_params()  # (the cases' ns_dtype "param": float32)
    ref, eng = CASES[name](ref_p, "foreach"), CASES[name](eng_p, "triton")
    run(ref, ref_p, 2), run(eng, eng_p, 2)
    eng.found_inf = torch.ones((), device="cuda")
    if eng.needs_reference_grad:
        set_grads(eng_p, 8)
        eng.store_reference_grad()
    set_grads(eng_p, 7)
    eng.step()
    eng.uncount_last_step()
    eng.found_inf = torch.zeros((), device="cuda")
    run(ref, ref_p, 2, start=2), run(eng, eng_p, 2, start=2)
    assert set(eng.route_counts) == {"engine"}, eng.route_counts
    assert_same(ref_p, ref, eng_p, eng, tol=dict(rtol=1e-4, atol=1e-5))


def gpu_front_end():
    """Triton's front end for an sm_90 target (no GPU needed): ``compile(fn, sig, consts)`` runs
    ``make_ir`` as ``triton.compile`` does first; None where this Triton's internals differ."""
    try:
        from triton._C.libtriton import ir
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from triton.compiler.compiler import make_backend

        target = GPUTarget("cuda", 90, 32)
        backend = make_backend(target)
        options = backend.parse_options({"enable_fp_fusion": True})
    except Exception:  # noqa: BLE001 (another Triton: the check is skipped, not failed)
        return None

    def compile_(fn, sig: dict, consts: dict):
        context = ir.context()
        ir.load_dialects(context)
        backend.load_dialects(context)
        src = ASTSource(fn=fn, signature={**sig, **dict.fromkeys(consts, "constexpr")},
                        constexprs=consts)  # fmt: skip
        src.make_ir(target, options, backend.get_codegen_implementation(options),
                    backend.get_module_map(), context)  # fmt: skip

    return compile_


def test_the_kernels_pass_the_gpu_compilers_front_end():
    """The interpreter runs the kernels as Python and accepts what the GPU compiler refuses
    (a type mismatch between branches, a non-constexpr global): every kernel, in the variants
    the covered families use, goes through Triton's front end for an sm_90 target here."""
    import triton.language as tl

    from optim.engine import layout as L

    compile_ = gpu_front_end()
    if compile_ is None:
        pytest.skip("this Triton's compiler internals differ (make_ir, make_backend)")
    k = loader.kernels("jit")
    f32, scalars = "fp32", "kappa beta m_add lion_u lion_m b2 v_add keep neg_size bc2s bc1 eps"
    head = {"table": "*i64", "blocks": "*i32", "divisors": "*fp32", "skip": "*u8",
            "gscale": "*fp32"}  # fmt: skip
    step = {**head, **dict.fromkeys((scalars + " mix b3 s_add").split(), f32)}
    rules = [(L.EMA, L.ADAM, 1, True), (L.EMA_LERP, L.ADAM_LERP, 0, False),
             (L.LION, L.SIGN, 0, False), (L.EMA, L.SIGN, 2, True), (L.EMA, L.ADEMAMIX, 1, False),
             (L.EMA, L.SOAP_ADAM, 0, True), (L.HEAVY_NESTEROV, L.NS_OUT, 0, True),
             (L.HEAVY_BALL, L.NS_OUT, 0, False), (L.ONE_BUFFER, L.NS_OUT, 0, False),
             (L.EMA, L.NS_OUT, 1, True)]  # fmt: skip
    for momentum, direction, clip, skip in rules:
        # NS's pre-pass with and without tall matrices stored transposed (merged stacks)
        for strided in (False, True) if direction == L.NS_OUT else (False,):
            compile_(k.step_kernel, step, dict(
                DT=tl.float32, OUT_DT=tl.bfloat16, BLOCK=4096, REDUCE=clip > 0, CLIP=clip,
                COPY_REF=clip > 0, MOMENTUM=momentum, DIRECTION=direction,
                AMSGRAD=direction == L.ADAM, SRC_C=True, FIRST=direction == L.SOAP_ADAM,
                HAS_SKIP=skip, ALIGNED=not skip, GSCALE=skip, STRIDED=strided,
                TILE=64))  # fmt: skip
    for dt in ("fp32", "fp64"):
        ty = getattr(tl, {"fp32": "float32", "fp64": "float64"}[dt])
        for reduce in (True, False):  # the MARS clip's norm, the folded global clip's
            compile_(k.norm_kernel, {"table": "*i64", "blocks": "*i32", "partial": f"*{dt}",
                                     "kappa": f32, "gscale": f"*{dt}"},
                     dict(DT=ty, ACC=ty, BLOCK=4096, ALIGNED=True, REDUCE=reduce,
                          GSCALE=reduce))  # fmt: skip
        compile_(k.finish_clip_kernel, {"partial": f"*{dt}", "count": "i32", "out": f"*{dt}",
                                        "max_norm": f32, "eps": f32}, dict(CHUNK=1024))  # fmt: skip
        compile_(k.finish_tensor_kernel, {"table": "*i64", "partial": f"*{dt}",
                                          "divisors": f"*{dt}"}, dict(CHUNK=1024))  # fmt: skip
        compile_(k.finish_global_kernel, {"partial": f"*{dt}", "count": "i32",
                                          "divisors": f"*{dt}"}, dict(CHUNK=1024))  # fmt: skip
        # the folded clip's pass merged with MARS's, and a step's clips from its sums
        compile_(k.fold_norm_kernel, {"table": "*i64", "blocks": "*i32", "partial": f"*{dt}",
                                      "stride": "i32"},
                 dict(DT=ty, ACC=ty, BLOCK=4096, ALIGNED=True))  # fmt: skip
        for summed, glob in ((False, False), (True, True)):
            compile_(k.merged_finish_kernel, {"table": "*i64", "partial": f"*{dt}",
                                              "stride": "i32", "rows": "*i64",
                                              "coef": f"*{dt}", "kappa": f32,
                                              "out": f"*{dt}"},
                     dict(SUMMED=summed, GLOBAL=glob, CHUNK=1024))  # fmt: skip
    apply = {"table": "*i64", "blocks": "*i32", "src": "*bf16", "skip": "*u8", "keep": f32,
             "neg_size": f32, "neg_size_t": f32}  # fmt: skip
    for strided, skip in ((True, True), (False, False), (True, False)):
        compile_(k.apply_kernel, apply, dict(DT=tl.float32, SRC_DT=tl.bfloat16, BLOCK=4096,
                                             STRIDED=strided, HAS_SKIP=skip,
                                             ALIGNED=not skip, TILE=64))  # fmt: skip
    sf = {"table": "*i64", "blocks": "*i32", "gscale": "*fp32",
          **dict.fromkeys("b2 v_add bc2 eps decay ckp1 y_coef lr".split(), f32)}  # fmt: skip
    compile_(k.schedulefree_kernel, sf, dict(DT=tl.float32, BLOCK=4096, DECAY=True, ALIGNED=True,
                                             GSCALE=True))  # fmt: skip


def skipped_step_with_folded_clip(opt, params, max_norm: float) -> None:
    """NaN gradients, the clip folded, the step flagged non-finite on the device: it must
    change nothing (checked here)."""
    before = copy.deepcopy(opt.state_dict()), [p.detach().clone() for p in params]
    if opt.needs_reference_grad:
        set_grads(params, 9)
        opt.fold_grad_clip(max_norm, params)
        opt.store_reference_grad()
    for p in params:
        p.grad = torch.full_like(p, float("nan"))
    assert opt.fold_grad_clip(max_norm, params).isnan()
    opt.found_inf = torch.ones((), device=params[0].device)  # the flag where the Trainer keeps it
    opt.step()
    opt.uncount_last_step()
    opt.found_inf = torch.zeros((), device=params[0].device)
    opt.zero_grad(set_to_none=True)
    assert all(torch.equal(p, q) for p, q in zip(params, before[1]))
    for i, state in opt.state_dict()["state"].items():  # exact: a new stored reference
        old = {k: v for k, v in before[0]["state"][i].items() if k != "previous_grad"}
        torch.testing.assert_close({k: state[k] for k in old}, old, rtol=0, atol=0)


def clip_like_trainer(opt, params, fold: bool, max_norm: float) -> torch.Tensor:
    """The Trainer's clip: ``clip_grad_norm_``, or the engine's fold (the gradients untouched:
    they are scaled inside the step only). Returns the norm."""
    if not fold:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    raw = [p.grad.clone() for p in params]
    norm = opt.fold_grad_clip(max_norm, params)
    assert norm is not None, opt.clip_fold_off_reason
    assert all(torch.equal(p.grad, g) for p, g in zip(params, raw))
    return norm


def trainer_steps(opt, params, n: int, fold: bool, max_norm: float, start: int = 0) -> list:
    """The Trainer's order (optim/engine/clip.py): (exact) the reference pass, clipped, stored;
    the gradient, clipped; the step; ``zero_grad``. Returns every norm the clips returned."""
    norms = []
    for t in range(start, start + n):
        for group in opt.param_groups:
            group["lr"] = LRS[t % len(LRS)]
        if getattr(opt, "needs_reference_grad", False):
            set_grads(params, t, salt=1000)
            norms.append(clip_like_trainer(opt, params, fold, max_norm))
            opt.store_reference_grad()
            opt.zero_grad(set_to_none=True)
        set_grads(params, t)
        norms.append(clip_like_trainer(opt, params, fold, max_norm))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return norms
