"""The engine with Newton-Schulz split over DDP ranks (optim/engine/ns.py), 2 and 4 gloo
processes on the CPU through Triton's interpreter.

Every rank holds the same (averaged) gradients, as after DDP's all-reduce. Muon and MARS-M on the
engine, the trainer's clip folded, each rank orthogonalising the matrices it owns and gathering
the rest: the same parameters as the foreach path's split with ``clip_grad_norm_`` (float64,
1e-12), bit for bit the same on every rank, each rank's routes the same, per stack a step one
all-gather of the slots every rank fills and a broadcast a matrix beyond, the clip folded and the non-finite decision on the device (a flagged step writes
nothing). Skipped without triton.
"""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytest.importorskip("triton")

import optim.newton_schulz as ns  # noqa: E402
from helpers import rendezvous  # noqa: E402
from optim import MARS_M, Muon  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.slow]
# wide, tall (its transpose's shape), square, a lone tall one: counts 3, 2, 1, 1
SHAPES = [(4, 6), (6, 4), (4, 6), (5, 5), (4, 6), (7, 3), (6, 4), (9,)]
LRS, SCALES, MAX_NORM = [1e-2, 3e-3, 2e-2, 5e-3], [0.05, 3.0, 0.3, 2.0], 3.0
MAKE = {
    "muon": lambda mats, rest, f: Muon(
        mats, adamw_params=rest, ns_dtype="float64", implementation=f
    ),
    "mars-m": lambda mats, rest, f: MARS_M(
        muon_params=mats, adamw_params=rest, lr=1e-2, ns_dtype="float64", implementation=f
    ),  # fmt: skip
}


def params() -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(s, generator=gen, dtype=torch.float64)) for s in SHAPES]


def trainer_steps(opt, ps, n: int, fold: bool, flagged: int = -1, place=None) -> None:
    """The trainer's steps (a new lr, the clip, the step); step ``flagged`` is skipped on the
    device (``found_inf``) after its gradients were made; ``place`` puts each whole gradient
    where its parameter lives (tests/test_engine_ns_shards.py: a DTensor), None: as it is."""
    for t in range(n):
        gen = torch.Generator().manual_seed(100 + t)
        for p in ps:
            g = torch.randn(p.shape, generator=gen, dtype=p.dtype) * SCALES[t % 4]
            p.grad = g if place is None else place(g)
        for group in opt.param_groups:
            group["lr"] = LRS[t % 4]
        if fold:
            assert opt.fold_grad_clip(MAX_NORM, ps) is not None, opt.clip_fold_off_reason
        else:
            torch.nn.utils.clip_grad_norm_(ps, MAX_NORM)
        opt.found_inf = torch.tensor(1.0 if t == flagged else 0.0, dtype=torch.float64)
        opt.step()
        if t == flagged:
            opt.uncount_last_step()


def run(name: str, how: str, flagged: int = -1) -> tuple[list, object]:
    ps = params()
    opt = MAKE[name]([p for p in ps if p.ndim == 2], [p for p in ps if p.ndim != 2], how)
    trainer_steps(opt, ps, 4, how == "triton", flagged)
    return [p.detach().clone() for p in ps], opt


def _worker(rank: int, world: int, init: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    from optim.engine import launch

    launch.BLOCKS["cpu"], launch.CHUNK["cpu"] = 16, 2  # several blocks a tensor, as test_engine
    dist.init_process_group("gloo", init_method=init, rank=rank,
                            world_size=world)  # fmt: skip
    calls = []
    gather, broadcast = ns._all_gather, ns._broadcast
    ns._all_gather = lambda out, local: (calls.append(tuple(out.shape)), gather(out, local))[1]
    ns._broadcast = lambda t, src: (calls.append(("b", *t.shape)), broadcast(t, src))[1]
    try:
        out = {}
        for name in MAKE:
            eng, opt = run(name, "triton")
            gathers, calls[:] = list(calls), []
            ref, _ = run(name, "foreach")
            ref_gathers, calls[:] = len(calls), []
            skipped, _ = run(name, "triton", flagged=2)
            calls[:] = []
            out[name] = dict(engine=eng, ref=ref, gathers=gathers, ref_gathers=ref_gathers,
                             paths=dict(opt.route_counts), skipped=skipped,
                             routes=[(n, r.name) for n, r in opt.last_routes],
                             device_skip=opt.device_skip_cost(), fold=opt.can_fold_clip())  # fmt: skip
        torch.save(out, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_engine_splits_newton_schulz_over_gloo_ranks(tmp_path, world):
    """2 and 4 ranks (on 4, every stack leaves some rank an empty slot)."""
    mp.spawn(_worker, args=(world, rendezvous(tmp_path), str(tmp_path)), nprocs=world)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    for name in MAKE:
        one, _ = run(name, "foreach")  # one process, no split: the reference of both
        for rank in range(world):
            r = results[rank][name]
            assert r["paths"] == {"engine": 8}, (name, r["paths"])  # 2 buckets x 4 steps
            assert r["fold"] and r["device_skip"] is None  # the clip folds; found_inf on device
            for a, b, c in zip(r["engine"], r["ref"], one):
                torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
                torch.testing.assert_close(b, c, rtol=1e-12, atol=1e-14)
            # CPU ns_fused off: one stack per shape, (4, 6), (6, 4), (5, 5), (7, 3); a step: an
            # all-gather a stack every rank fills, a broadcast a matrix beyond (none padded)
            each = ns.split_traffic([s for s in SHAPES if len(s) == 2], world, merged=False)
            per_step = sum(1 for b in each if b["k"]) + sum(b["broadcasts"] for b in each)
            assert len(r["gathers"]) == 4 * per_step == r["ref_gathers"], r["gathers"]
            assert ("b", 5, 5) in r["gathers"]  # the lone square: broadcast from its owner
        for other in range(1, world):
            for a, b in zip(results[0][name]["engine"], results[other][name]["engine"]):
                assert torch.equal(a, b), (name, "the ranks differ")
            for a, b in zip(results[0][name]["skipped"], results[other][name]["skipped"]):
                assert torch.equal(a, b), (name, "the ranks differ after a skipped step")
        routes = [results[r][name]["routes"] for r in range(world)]  # each rank's, the same
        assert all(r == routes[0] for r in routes) and {r for _, r in routes[0]} == {"engine"}
        skipped_ref, _ = run(name, "foreach", flagged=2)
        for a, b in zip(results[0][name]["skipped"], skipped_ref):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
