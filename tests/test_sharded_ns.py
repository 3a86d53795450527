"""Newton-Schulz of FSDP2-sharded matrices on their owners (optim/sharded.py), 2 gloo processes:
two all-to-alls per shape a step, in the Newton-Schulz dtype, the results equal one process's."""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import optim.newton_schulz as ns
from helpers import rendezvous

pytestmark = pytest.mark.slow
# counts 3, 1, 1, 1; (1, 6): rank 1 holds no row; (9, 6): uneven blocks (5 and 4 rows)
SHAPES = [(9, 6), (5, 5), (9, 6), (1, 6), (9, 6), (11, 6)]


def matrices() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=gen, dtype=torch.float32) for s in SHAPES]


def orthogonalised(us, dtype, divisor):
    return ns.orthogonalise(us, steps=5, eps=1e-7, dtype=dtype, divisor=divisor,
                            distributed=False, cast_back=True)  # fmt: skip


def _worker(rank: int, world: int, init: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank,
                            world_size=world)  # fmt: skip
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    calls, real = [], dist.all_to_all_single

    def counted(out, inp, *args, **kw):
        calls.append(inp.dtype)
        return real(out, inp, *args, **kw)

    dist.all_to_all_single = counted
    try:
        mesh = init_device_mesh("cpu", (world,))
        us = [distribute_tensor(u, mesh, [Shard(0)]) for u in matrices()]
        out = {}
        for name, dtype, divisor in (("bf16", torch.bfloat16, 0.1), ("fp32", torch.float32, None)):
            calls.clear()
            got = orthogonalised(us, dtype, divisor)
            out[name] = ([g.full_tensor() for g in got], list(calls))
        torch.save(out, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.all_to_all_single = real
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_sharded_newton_schulz_is_two_all_to_alls_per_shape_and_equals_one_process(tmp_path, world):
    """On 2 and 4 ranks (on 4, (5, 5) and (1, 6) leave ranks without a row)."""
    mp.spawn(_worker, args=(world, rendezvous(tmp_path), str(tmp_path)), nprocs=world)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    for name, dtype, divisor in (("bf16", torch.bfloat16, 0.1), ("fp32", torch.float32, None)):
        want = orthogonalised(matrices(), dtype, divisor)
        for rank in range(world):
            got, calls = results[rank][name]
            assert calls == [dtype] * 2 * 4, calls  # 4 shapes, there and back, in NS's dtype
            for g, w in zip(got, want):
                assert g.dtype == torch.float32 and torch.equal(g, w), (name, rank)
