"""Newton-Schulz on FSDP2 shards on the engine (optim/engine/ns_shards.py), 2 and 4 gloo
processes on the CPU through Triton's interpreter, float64.

Every parameter a ``Shard(0)`` DTensor on a 1-D mesh (uneven row blocks; on 4 ranks some ranks
hold no row of a matrix, and some own none of a shape's matrices). Muon and MARS-M on the engine,
the trainer's clip folded, the non-finite decision on the device (a flagged step writes nothing):
the same parameters as the foreach owners' path with ``clip_grad_norm_`` (1e-12) and as one
process without shards, bit for bit the same on every rank; per step two all-to-alls a shape,
and the bytes each rank sends are its blocks' own (no padding). Skipped without triton.
"""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytest.importorskip("triton")

from test_engine_ddp import MAKE, trainer_steps  # noqa: E402

from helpers import rendezvous  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.slow]
# wide, tall, square, a lone tall one, one of 2 rows (on 4 ranks two hold none), a vector
SHAPES = [(4, 6), (6, 4), (4, 6), (5, 5), (4, 6), (7, 3), (6, 4), (2, 5), (9,)]


def whole(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def params(mesh=None) -> list[torch.nn.Parameter]:
    from torch.distributed.tensor import Shard, distribute_tensor

    gen = torch.Generator().manual_seed(0)
    ts = [torch.randn(s, generator=gen, dtype=torch.float64) for s in SHAPES]
    if mesh is not None:
        ts = [distribute_tensor(t, mesh, [Shard(0)]) for t in ts]
    return [torch.nn.Parameter(t) for t in ts]


def run(name: str, how: str, mesh=None, flagged: int = -1) -> tuple[list, object]:
    from torch.distributed.tensor import Shard, distribute_tensor

    ps = params(mesh)
    opt = MAKE[name]([p for p in ps if p.ndim == 2], [p for p in ps if p.ndim != 2], how)
    place = None if mesh is None else (lambda g: distribute_tensor(g, mesh, [Shard(0)]))
    trainer_steps(opt, ps, 4, how == "triton", flagged, place)
    return [whole(p.detach()).clone() for p in ps], opt


def _worker(rank: int, world: int, init: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    from torch.distributed.device_mesh import init_device_mesh

    from optim.engine import launch, ns_shards

    launch.BLOCKS["cpu"], launch.CHUNK["cpu"] = 16, 2  # several blocks a tensor
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    trips, real = [], ns_shards._all_to_all
    ns_shards._all_to_all = lambda *a, **kw: (trips.append(1), real(*a, **kw))[1]
    try:
        out = {}
        for name in MAKE:
            eng, opt = run(name, "triton", mesh)
            count, trips[:] = len(trips), []
            stacks = [ln.stacks for ln in opt.engine_state.program.launches if ln.stacks]
            sent = sum(s.send.numel() for st in stacks for s in st.stacks)
            ref, _ = run(name, "foreach", mesh)
            skipped, _ = run(name, "triton", mesh, flagged=2)
            out[name] = dict(engine=eng, ref=ref, skipped=skipped, trips=count, sent=sent,
                             paths=dict(opt.route_counts), fold=opt.can_fold_clip(),
                             routes=[(n, r.name) for n, r in opt.last_routes],
                             device_skip=opt.device_skip_cost())  # fmt: skip
            trips[:] = []
        torch.save(out, f"{out_dir}/rank{rank}.pt")
    finally:
        ns_shards._all_to_all = real
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_engine_runs_newton_schulz_on_fsdp_shards_over_gloo_ranks(tmp_path, world):
    mp.spawn(_worker, args=(world, rendezvous(tmp_path), str(tmp_path)), nprocs=world)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    matrices = [s for s in SHAPES if len(s) == 2]
    for name in MAKE:
        one, _ = run(name, "foreach")  # one process, no shards: the reference of both
        skipped_one, _ = run(name, "foreach", flagged=2)
        for rank in range(world):
            r = results[rank][name]
            assert r["paths"] == {"engine": 8}, (name, r["paths"])  # 2 buckets x 4 steps
            assert r["fold"] and r["device_skip"] is None  # the clip folds; found_inf on device
            assert {route for _, route in r["routes"]} == {"engine"}, r["routes"]
            for a, b, c in zip(r["engine"], r["ref"], one):
                torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
                torch.testing.assert_close(b, c, rtol=1e-12, atol=1e-14)
            for a, b in zip(r["skipped"], skipped_one):
                torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
            assert r["trips"] == 4 * 2 * len(set(matrices)), r["trips"]  # 4 steps, 2 a shape
            rows = [-(-m // world) for m, _ in matrices]  # torch.chunk's cut of each matrix
            mine = [max(0, min(m, (rank + 1) * c) - rank * c) for (m, _), c in zip(matrices, rows)]
            assert r["sent"] == sum(k * n for k, (_, n) in zip(mine, matrices)), r["sent"]
        for other in range(1, world):
            for key in ("engine", "skipped"):
                for a, b in zip(results[0][name][key], results[other][name][key]):
                    assert torch.equal(a, b), (name, key, "the ranks differ")
