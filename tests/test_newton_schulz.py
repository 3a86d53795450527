"""Newton-Schulz over many matrices (optim/newton_schulz.py): batched by shape equals one matrix
at a time, and the split over DDP ranks (2 gloo processes) gives the single-process parameters."""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import optim.newton_schulz as ns
from helpers import rendezvous
from optim import MARS, MARS_M, Muon, sharded
from optim.functional import newton_schulz

# wide, tall, square, a tall one of another width; counts 3, 2, 1, 2 (odd ones pad under a split)
SHAPES = [(8, 24), (24, 8), (8, 24), (16, 16), (8, 24), (40, 12), (24, 8), (40, 12)]


def matrices(seed: int = 0, dtype=torch.float64) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=dtype) for s in SHAPES]


@pytest.mark.parametrize("divisor", [None, 0.05])
def test_batched_equals_one_at_a_time_float64(divisor):
    us = matrices()
    kw = dict(steps=5, eps=1e-7, dtype=torch.float64, divisor=divisor, distributed=False)
    batched = ns.orthogonalise(us, batched=True, **kw)
    single = ns.orthogonalise(us, batched=False, **kw)
    for u, b, s in zip(us, batched, single):
        assert b.shape == u.shape and b.dtype == torch.float64
        torch.testing.assert_close(b, s, rtol=0, atol=1e-12)
        x = u if divisor is None else u / divisor
        torch.testing.assert_close(s, newton_schulz(x, 5, 1e-7, torch.float64), rtol=0, atol=0)


def test_batched_close_in_bfloat16_and_orthogonal():
    us = matrices(1, torch.float32)
    kw = dict(steps=5, eps=1e-7, dtype=torch.bfloat16, distributed=False)
    batched = ns.orthogonalise(us, batched=True, **kw)
    single = ns.orthogonalise(us, batched=False, **kw)
    for b, s in zip(batched, single):
        assert b.dtype == torch.bfloat16
        torch.testing.assert_close(b.float(), s.float(), rtol=0, atol=2e-2)
        sv = torch.linalg.svdvals(b.float())
        assert 0.5 < sv.min() and sv.max() < 1.5  # NS5 puts singular values near 1


def test_dtype_none_keeps_each_matrix_dtype():
    us = [torch.randn(4, 6, dtype=torch.float64), torch.randn(4, 6, dtype=torch.float32)]
    outs = ns.orthogonalise(us, steps=5, eps=1e-7, dtype=None, distributed=False)
    assert [o.dtype for o in outs] == [torch.float64, torch.float32]


@pytest.mark.parametrize("world", [2, 3, 8])
@pytest.mark.parametrize("batched", [True, False])
def test_split_blocks_cover_every_matrix_once(monkeypatch, world, batched):
    """Simulated ranks: each fills only its own block of the gather and its own broadcasts;
    together they are whole."""
    us = matrices(2)
    want = ns.orthogonalise(us, steps=5, eps=1e-7, dtype=torch.float64, distributed=False)
    owner = [None] * len(us)

    def fake_gather(out, local):  # a gather that brings only this rank's block
        out.fill_(float("nan"))
        out[rank * local.shape[0] : (rank + 1) * local.shape[0]] = local
        return None

    def fake_broadcast(t, src):  # a broadcast that brings nothing from another rank
        if src != rank:
            t.fill_(float("nan"))

    monkeypatch.setattr(ns, "_all_gather", fake_gather)
    monkeypatch.setattr(ns, "_broadcast", fake_broadcast)
    for rank in range(world):
        monkeypatch.setattr(ns, "split_world", lambda _, rank=rank: (rank, world))
        got = ns.orthogonalise(
            us, steps=5, eps=1e-7, dtype=torch.float64, batched=batched, distributed=True
        )
        for i, (g, w) in enumerate(zip(got, want)):
            if not g.isnan().any():
                assert owner[i] is None, f"matrix {i} computed by ranks {owner[i]} and {rank}"
                owner[i] = rank
                torch.testing.assert_close(g, w, rtol=0, atol=1e-12)
    assert None not in owner


def gpt2_small_matrices(embeddings: bool) -> list[tuple[int, int]]:
    """GPT-2 small's Newton-Schulz matrices: the 48 block matrices (the default routing), with
    the tied embedding and the positions first under the MARS repo's Muon routing."""
    from bench.newton_schulz import adamw_shapes, block_shapes, model_spec

    spec = model_spec("gpt2-small")
    return (adamw_shapes(spec)[:2] if embeddings else []) + block_shapes(spec, spec["n_layer"])


def test_split_balances_gpt2_small_flops_over_8_ranks():
    """FLOPs per rank from the assignment: within 1.3x of the mean for GPT-2 small's matrices on
    8 ranks, and no batch padded beyond its count (each rank holds at most ``ceil(n / W)`` of a
    batch: what the all-gather sends per rank). With the tied embedding on Muon (598 GFLOP, more
    than the mean) its rank is the busiest, still below the old split's 805 on rank 0."""
    shapes = gpt2_small_matrices(embeddings=False)
    for merged in (True, False):
        load = ns.rank_flops(shapes, 8, merged=merged)
        assert sum(load) == sum(sharded.ns_flops(s) for s in shapes)
        assert max(load) <= 1.3 * sum(load) / 8, [f / 1e9 for f in load]
    official = gpt2_small_matrices(embeddings=True)
    assert round(sharded.ns_flops(official[0]) / 1e9) == 598
    load = ns.rank_flops(official, 8)
    assert max(load) == load[ns.assign(official, 8)[0]] < 805e9
    for shapes_, merged in ((shapes, True), (shapes, False), (official, True)):
        for g in ns.split_traffic(shapes_, 8, merged=merged):
            n = sum(1 for s in shapes_ if tuple(sorted(s) if merged else s) ==
                    tuple(sorted(g["shape"]) if merged else g["shape"]))  # fmt: skip
            assert g["n"] == n and g["k"] * 8 + g["broadcasts"] == n, g  # no slot padded


def test_assign_is_a_function_of_the_shapes_and_one_rank_owns_all():
    shapes = gpt2_small_matrices(embeddings=True)
    assert ns.assign(shapes, 8) == ns.assign(list(shapes), 8)
    assert ns.assign(shapes, 1) == [0] * len(shapes) and ns.rank_flops([], 4) == [0] * 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_batched_close_to_one_at_a_time_on_cuda():
    """cuBLAS may pick another kernel for a batched GEMM: in float64 the results agree; in
    bf16 five iterations amplify the other rounding (an element 0.035 apart was seen on an H100,
    torch 2.11), so the test is that batching costs no accuracy: both are as far from the
    float64 result as each other."""
    us = [u.cuda() for u in matrices(1, torch.float32)]
    kw = dict(steps=5, eps=1e-7, distributed=False)
    exact = ns.orthogonalise(us, batched=False, dtype=torch.float64, **kw)
    batched = ns.orthogonalise(us, batched=True, dtype=torch.float64, **kw)
    for b, s in zip(batched, exact):
        torch.testing.assert_close(b, s, rtol=0, atol=1e-12)
    batched = ns.orthogonalise(us, batched=True, dtype=torch.bfloat16, **kw)
    single = ns.orthogonalise(us, batched=False, dtype=torch.bfloat16, **kw)
    for b, s, x in zip(batched, single, exact):
        err_b, err_s = ((t.double() - x).norm() / x.norm() for t in (b, s))
        assert err_b <= 1.5 * err_s + 1e-2, (err_b, err_s)


def test_split_is_off_without_a_process_group():
    assert not dist.is_initialized()
    assert ns.split_world(True) == (0, 1)


# ---- two gloo processes: the split gives every rank the single-process parameters ----

OPTIMIZERS = {
    "muon": lambda ps, **kw: Muon(ps[:-1], adamw_params=ps[-1:], ns_dtype="float32", **kw),
    "mars-m": lambda ps, **kw: MARS_M(lr=2e-2, muon_params=ps[:-1], adamw_params=ps[-1:], **kw),
    "mars-shampoo": lambda ps, **kw: MARS(ps, lr=2e-2, mars_type="mars-shampoo", **kw),
}  # mars-m and mars-shampoo: Newton-Schulz in bf16 (the default)


def run_steps(name: str, steps: int = 3, **kw) -> list[torch.Tensor]:
    """``steps`` steps of optimizer ``name`` on SHAPES plus a bias, with seeded gradients (the
    same on every rank, as after DDP's all-reduce)."""
    params = [torch.nn.Parameter(m) for m in matrices(3, torch.float32)]
    params.append(torch.nn.Parameter(torch.randn(8, generator=torch.Generator().manual_seed(5))))
    opt = OPTIMIZERS[name](params, **kw)
    g = torch.Generator().manual_seed(4)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
    return [p.detach().clone() for p in params]


def _worker(rank: int, world: int, init: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank,
                            world_size=world)  # fmt: skip
    calls = []
    gather, broadcast = ns._all_gather, ns._broadcast
    ns._all_gather = lambda out, local: (calls.append(local.shape), gather(out, local))[1]
    ns._broadcast = lambda t, src: (calls.append(t.shape), broadcast(t, src))[1]
    try:
        results = {}
        for name in OPTIMIZERS:
            split = run_steps(name)
            gathers, calls[:] = len(calls), []
            off = run_steps(name, ns_distributed=False)
            results[name] = (split, off, gathers, len(calls))
        torch.save(results, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_processes_equal_one_bit_for_bit(tmp_path):
    """Each rank orthogonalises the matrices it owns (by FLOPs) and receives the rest (an
    all-gather of the slots both fill, a broadcast from its owner of each matrix beyond: the
    lone square one); the parameters after 3
    steps equal the single-process ones exactly (float32 and bf16 NS on CPU: a slice of a batched
    matmul rounds as the single matmul), and so does the split turned off."""
    world = 2
    mp.spawn(_worker, args=(world, rendezvous(tmp_path), str(tmp_path)), nprocs=world)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    for name in OPTIMIZERS:
        want = run_steps(name)
        for rank in range(world):
            split, off, gathers, gathers_off = results[rank][name]
            # 3 steps x (an all-gather a shape both ranks hold + a broadcast a matrix beyond)
            each = ns.split_traffic([tuple(s) for s in SHAPES], world, merged=False)
            per_step = sum(1 for b in each if b["k"]) + sum(b["broadcasts"] for b in each)
            assert gathers == 3 * per_step and gathers_off == 0  # none when off
            assert any(b["shape"] == (16, 16) and b["broadcasts"] == 1 for b in each)
            for w, a, b in zip(want, split, off):
                assert torch.equal(w, a), (name, rank, "split")
                assert torch.equal(w, b), (name, rank, "off")
        for a, b in zip(results[0][name][0], results[1][name][0]):
            assert torch.equal(a, b), (name, "the ranks differ")
    own = ns.assign([tuple(s) for s in SHAPES], world)
    assert own.count(0) and own.count(1) and own[SHAPES.index((16, 16))] in (0, 1)


@pytest.mark.parametrize("global_precision", ["high", "medium"])
def test_float32_newton_schulz_runs_at_full_precision_under_global_tf32(
    monkeypatch, global_precision
):
    """``set_float32_matmul_precision("high")`` (or ``allow_tf32``) turns float32 matmuls into
    TF32 on GPUs; ``ns_dtype=float32`` must still mean float32, and the global setting is kept."""
    import optim.functional as F

    seen = []
    iterate = F._iterate

    def spy(x, steps):
        seen.append((x.dtype, torch.get_float32_matmul_precision()))
        return iterate(x, steps)

    monkeypatch.setattr(F, "_iterate", spy)
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(global_precision)
    try:
        p = torch.nn.Parameter(torch.randn(8, 4))
        opt = Muon([p], ns_dtype="float32")
        p.grad = torch.randn(8, 4)
        opt.step()
        F.newton_schulz(torch.randn(4, 4), dtype=torch.bfloat16)
        assert torch.get_float32_matmul_precision() == global_precision  # restored
    finally:
        torch.set_float32_matmul_precision(before)
    assert seen == [(torch.float32, "highest"), (torch.bfloat16, global_precision)]
