"""The engine's Newton-Schulz stacks batched as the foreach path batches them (optim/engine/ns.py).

With the fused iteration (``ns_fused``, on CUDA by default) ``orthogonalise`` puts a tall
``(m, n)`` in one batch with ``(n, m)``; the engine then keeps one stack for both, its pre-pass
writing a tall matrix's ``u`` transposed into the stack and its update reading the result back
transposed, with the scale of the matrix's own shape. A model with ``(m, n)``, ``(n, m)``, a
square matrix, a tall shape alone and a vector: every Muon-family rule on the engine, with the
trainer's clip folded and a skipped non-finite step, equals the foreach path with
``clip_grad_norm_`` (float64, 1e-12); in bf16 to bf16's rounding. Triton's interpreter, as
tests/test_engine.py. Skipped without triton.
"""

import pytest
import torch

pytest.importorskip("triton")

from test_engine import (  # noqa: E402
    TOL,
    assert_same,
    make_params,
    skipped_step_with_folded_clip,
    small_blocks,  # noqa: F401  (the autouse fixture: 16-element blocks)
    split,
    trainer_steps,
)

from optim import MARS, MARS_M, MARS_M_Efficient, Moonlight, Muon  # noqa: E402
from optim.engine import layout as L  # noqa: E402
from optim.newton_schulz import _same_shape  # noqa: E402

pytestmark = pytest.mark.engine
# (12, 5) twice and (5, 12): one stack merged; (7, 7) square; (10, 4) tall with no partner
SHAPES = [(12, 5), (5, 12), (7, 7), (12, 5), (10, 4), (9,)]
MAX_NORM = 6.0  # the gradients' norms are about 0.8, 50, 5 and 33: it fires on steps 1 and 3
NS = {
    "muon": lambda p, f, d: Muon(p, weight_decay=0.1, ns_dtype=d, implementation=f),
    "moonlight": lambda p, f, d: Moonlight(**split(p), ns_dtype=d, implementation=f),
    "mars-m": lambda p, f, d: MARS_M(**split(p), ns_dtype=d, implementation=f),
    "mars-m-exact": lambda p, f, d: MARS_M(**split(p), ns_dtype=d, is_approx=False, implementation=f),
    "mars-m-exact-global": lambda p, f, d: MARS_M(**split(p), ns_dtype=d, is_approx=False,
                                                  clip="global", implementation=f),
    "mars-m-efficient": lambda p, f, d: MARS_M_Efficient(**split(p), ns_dtype=d, implementation=f),
    "mars-shampoo": lambda p, f, d: MARS(p, mars_type="mars-shampoo", ns_dtype=d, implementation=f),
}  # fmt: skip


def build(name: str, params, how: str, merge: bool, dtype: str = "param"):
    opt = NS[name](params, how, dtype)
    groups = [g for g in opt.param_groups if "ns_fused" in g]
    assert groups, "no Newton-Schulz group"
    for g in groups:  # the fused iteration, as on CUDA: (m, n) and (n, m) one batch
        g["ns_fused"] = merge
    return opt


def steps(opt, params, n: int, fold: bool, start: int = 0) -> list:
    return trainer_steps(opt, params, n, fold, MAX_NORM, start)


def engine_stacks(opt) -> list:
    return [s for v in opt.engine_state.cache.plans.values() for s in getattr(v, "stacks", [])]


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "per-shape"])
@pytest.mark.parametrize("name", sorted(NS))
def test_engine_equals_foreach_with_merged_stacks(name, merge):
    """Five steps (a new lr each, the clip firing on some), a skipped non-finite step between
    the second and third: the engine with the folded clip equals foreach with
    ``clip_grad_norm_``, and keeps as many stacks as foreach makes batches."""
    ref_p, eng_p = make_params(SHAPES), make_params(SHAPES)
    ref, eng = build(name, ref_p, "foreach", merge), build(name, eng_p, "triton", merge)
    norms = steps(ref, ref_p, 2, False), steps(eng, eng_p, 2, True)
    skipped_step_with_folded_clip(eng, eng_p, MAX_NORM)
    norms = [a + b for a, b in zip(norms, (steps(ref, ref_p, 3, False, start=2),
                                           steps(eng, eng_p, 3, True, start=2)))]  # fmt: skip
    fired = [float(n) > MAX_NORM for n in norms[0]]
    assert any(fired) and not all(fired)
    for a, b in zip(*norms):
        torch.testing.assert_close(b, a, **TOL)
    assert eng.off_reason is None and set(eng.route_counts) == {"engine"}
    assert_same(ref_p, ref, eng_p, eng)
    matrices = [p for p in eng_p if p.ndim == 2]
    stacks = engine_stacks(eng)
    assert len(stacks) == len(_same_shape(matrices, merge_transposed=merge)) == (3 if merge else 4)
    transposed = sum(int(s.plan.table[:, L.C_TCOLS].gt(0).sum()) for s in stacks)
    assert transposed == 3  # the (12, 5) and (10, 4) matrices: merged or left by NS transposed


@pytest.mark.parametrize("name", ["muon", "moonlight", "mars-m-exact", "mars-shampoo"])
def test_merged_stacks_in_bf16(name):
    """NS in its default bf16 on merged stacks: the pre-pass's strided store rounds as the
    foreach path's stacking copy, so the updates agree to bf16's rounding."""
    ref_p, eng_p = make_params(SHAPES), make_params(SHAPES)
    ref = build(name, ref_p, "foreach", True, "bfloat16")
    eng = build(name, eng_p, "triton", True, "bfloat16")
    steps(ref, ref_p, 3, False), steps(eng, eng_p, 3, True)
    assert_same(ref_p, ref, eng_p, eng, tol=dict(rtol=1e-6, atol=1e-9))
    stacks = engine_stacks(eng)
    assert {s.stack.dtype for s in stacks} == {torch.bfloat16}
    assert sorted(tuple(s.stack.shape) for s in stacks) == [(1, 4, 10), (1, 7, 7), (3, 5, 12)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["param", "bfloat16"])
@pytest.mark.parametrize("name", ["muon", "mars-m", "mars-m-exact", "mars-shampoo"])
def test_merged_stacks_on_cuda(name, dtype, monkeypatch):
    """The compiled kernels on the GPU (``ns_fused`` left to its CUDA default: merged), float32
    parameters: whole blocks and tails, transposed slices by tiles, the folded clip, a skipped
    step; the same numbers as foreach with ``clip_grad_norm_`` to float32 rounding (NS in
    float32 or bf16 on the same stacks as the foreach path's batches)."""
    from optim.engine import launch

    monkeypatch.setitem(launch.BLOCKS, "cuda", 1024)
    shapes = [(96, 40), (40, 96), (64, 64), (96, 40), (130, 33), (4097,)]

    def cuda_params():
        return [torch.nn.Parameter(p.detach().float().cuda()) for p in make_params(shapes)]

    ref_p, eng_p = cuda_params(), cuda_params()
    ref, eng = NS[name](ref_p, "foreach", dtype), NS[name](eng_p, "triton", dtype)
    steps(ref, ref_p, 2, False), steps(eng, eng_p, 2, True)
    skipped_step_with_folded_clip(eng, eng_p, MAX_NORM)
    steps(ref, ref_p, 3, False, start=2), steps(eng, eng_p, 3, True, start=2)
    assert set(eng.route_counts) == {"engine"}, eng.route_counts
    assert len(engine_stacks(eng)) == 3  # (40, 96) with its two transposes, (64, 64), (33, 130)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == "param" else dict(rtol=2e-2, atol=2e-3)
    assert_same(ref_p, ref, eng_p, eng, tol=tol)
