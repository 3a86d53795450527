"""The optimizer step is not launch-bound: a bounded number of kernel-launching ops, whatever
the depth, and no host read (bench/launches.py counts them as routed for CUDA, on a CPU)."""

import pytest
import torch

import optim
from bench.launches import count_step
from optim.functional import newton_schulz
from optim.newton_schulz import orthogonalise

BOUND = 150  # the target: at most 150 per step on GPT-2 small and XL alike


# Every registered optimizer, SOAP and NorMuon included: their per-matrix work (the eigenbases
# and projections, the row normalisation) runs batched by shape (optim/soap_batched.py,
# optim/normuon.py), as Newton-Schulz does.
@pytest.mark.parametrize("name", optim.available())
def test_launches_bounded_and_flat_in_depth(name):
    two, four = count_step(name, 2, width=32), count_step(name, 4, width=32)
    assert two.launches == four.launches, (two.by_op, four.by_op)
    assert four.launches <= BOUND, four.by_op
    assert four.host_reads == 0


def test_muon_on_the_cpu_path_grows_with_depth():
    """The count sees per-tensor loops (the CPU default of the Muon family keeps one)."""
    two = count_step("muon", 2, width=32, as_cuda=False)
    four = count_step("muon", 4, width=32, as_cuda=False)
    assert four.launches > two.launches


def test_fused_iteration_matches_the_official_arithmetic_in_float64():
    torch.manual_seed(0)
    g = torch.randn(3, 8, 20, dtype=torch.float64)
    plain = newton_schulz(g, 5, 1e-7, torch.float64)
    fused = newton_schulz(g, 5, 1e-7, torch.float64, fused=True)
    torch.testing.assert_close(fused, plain, rtol=1e-12, atol=1e-12)


def test_fused_batches_transposed_shapes_together_with_the_same_numbers():
    torch.manual_seed(0)
    us = [torch.randn(8, 20, dtype=torch.float64), torch.randn(20, 8, dtype=torch.float64),
          torch.randn(5, 5, dtype=torch.float64)]  # fmt: skip
    ref = [newton_schulz(u, 5, 1e-7, torch.float64) for u in us]
    out = orthogonalise(us, steps=5, eps=1e-7, dtype=torch.float64, fused=True, cast_back=True)
    for o, r in zip(out, ref):
        assert o.shape == r.shape
        torch.testing.assert_close(o, r, rtol=1e-12, atol=1e-12)


def test_cast_back_returns_each_matrix_in_its_own_dtype():
    us = [torch.randn(4, 6), torch.randn(6, 4)]
    out = orthogonalise(us, steps=5, eps=1e-7, dtype=torch.bfloat16, cast_back=True)
    assert [o.dtype for o in out] == [torch.float32, torch.float32]
    assert [o.shape for o in out] == [u.shape for u in us]


# The target for the engine: at most 10 kernels per step for an element-wise optimizer,
# the global clip folded into it included (torch's AdamW: its own fused kernel, the clip torch's).
ELEMENT_WISE = ["mars-adamw", "mars-lion", "lion", "ademamix", "adamw-schedulefree", "adamw"]


@pytest.mark.engine
@pytest.mark.parametrize("name", ELEMENT_WISE)
def test_the_engine_route_counts_each_kernel_once_and_stays_under_ten(name):
    pytest.importorskip("triton")
    two, four = (count_step(name, n, width=32, route="engine") for n in (2, 4))
    assert two.launches == four.launches and four.host_reads == 0, four.by_op
    assert four.launches + (four.clip if four.folded else 0) <= 10, four.by_op
    assert four.folded == (name != "adamw")
    if name != "adamw":
        assert set(four.by_op) == {"launches::engine_kernel"} and four.clip == 2
    compiled = count_step(name, 4, width=32, route="compiled")
    assert compiled.clip > 2 and not compiled.folded  # clip_grad_norm_'s ops


@pytest.mark.engine
def test_the_engine_route_of_the_muon_family_is_flat_in_depth():
    pytest.importorskip("triton")
    two, four = (count_step("mars-m", n, width=32, route="engine") for n in (2, 4))
    assert two.launches == four.launches and four.host_reads == 0
    assert four.by_op["launches::engine_kernel"] <= 10 and four.folded
