"""The engine on FSDP2 shards (optim/engine/launch.py ``_finish_sharded``), 2 and 4 gloo
processes on the CPU through Triton's interpreter, float64.

tests/test_optim_fsdp.py's small model (uneven row blocks; one matrix of which rank 1 holds no
row; on 4 ranks several ranks hold none of some matrices) trained with ``fully_shard`` and with
DDP, every optimizer on the engine (``"triton"``): the element-wise buckets run on each rank's
local blocks, the trainer's global clip folded into the engine; from the second step (the
reference buffers made) its norm pass is merged with MARS's, and one small all-reduce a step
carries the clip's sum and MARS's per-tensor sums (optim/engine/clip.py; the first step: one
for the MARS clip's norms and one for the fold). FSDP equals DDP (1e-12, the clip's norms too),
every rank ends with the same whole parameters and took the same routes, and every bucket took
the engine: MARS-M's Newton-Schulz too, its matrices whole on their owner ranks
(optim/engine/ns_shards.py: two all-to-alls a shape, counted), so its clip folds as well.
Skipped without triton.
"""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytest.importorskip("triton")

from test_optim_fsdp import Tiny, ddp, forward_backward, fsdp  # noqa: E402

import optim  # noqa: E402
from helpers import rendezvous  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.slow]
STEPS = 4
MAX_NORM = 1.0  # the trainer's clip: fires on these gradients (LOSS_SCALE)
CASES = {  # case -> (registry name, config overrides)
    "mars-adamw": ("mars-adamw", {}),
    "mars-adamw:global": ("mars-adamw", {"clip": "global"}),
    "mars-lion": ("mars-lion", {}),
    "lion": ("lion", {}),
    "mars-m": ("mars-m", {"ns_dtype": "float64"}),
}
# on 4 ranks (cheaper): the element-wise MARS clips and the fold alone
FOUR = ["mars-adamw", "mars-adamw:global", "lion"]


def clip(opt, model) -> tuple[torch.Tensor, bool]:
    """The trainer's clip (trainer/trainer.py ``clip_grads``): folded where the optimizer can,
    else ``clip_grad_norm_`` (its DTensor norm made whole). The norm, and whether it folded."""
    norm = opt.fold_grad_clip(MAX_NORM, model.parameters())
    if norm is not None:
        return norm, True
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
    return (norm.full_tensor() if hasattr(norm, "full_tensor") else norm), False


def train(case: str, wrap) -> tuple[dict, dict, int, list]:
    """STEPS trainer steps of ``case`` on the engine (``zero_grad(set_to_none=False)``: the
    gradients keep their addresses, so the launch list is kept); the whole parameters, the paths
    taken and the lists built, the all-reduces of the step's clips (counted by a wrapper of
    ``dist.all_reduce``) and the global clip's norms with whether each folded."""
    from optim.engine import launch, ns_shards

    torch.manual_seed(0)
    model = Tiny().double()
    run = wrap(model)
    name, overrides = CASES[case]
    opt = optim.build_optimizer(
        model, optim.get_spec(name).config_cls(implementation="triton", **overrides)
    )
    reduces, real, norms, counts = [], launch.dist.all_reduce, [], []
    launch.dist.all_reduce = lambda t, **kw: (reduces.append(t.numel()), real(t, **kw))[1]
    trips, real_a2a = [], ns_shards._all_to_all
    ns_shards._all_to_all = lambda *a, **kw: (trips.append(1), real_a2a(*a, **kw))[1]
    try:
        for t in range(STEPS):
            forward_backward(run, t)
            before, trips_before = len(reduces), len(trips)
            norms.append(clip(opt, model))
            opt.step()
            counts.append((len(reduces) - before, len(trips) - trips_before))
            opt.zero_grad(set_to_none=False)  # (the gradients stay where they are)
    finally:
        launch.dist.all_reduce, ns_shards._all_to_all = real, real_a2a
    whole = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
             for n, p in model.named_parameters()}  # fmt: skip
    paths = {**opt.route_counts, "built": opt.engine_state.programs_built,  # (lists kept)
             "routes": [(label, r.name) for label, r in opt.last_routes]}  # fmt: skip
    return whole, paths, counts, norms


def _worker(rank: int, world: int, init: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    from optim.engine import launch

    launch.BLOCKS["cpu"], launch.CHUNK["cpu"] = 16, 2
    dist.init_process_group("gloo", init_method=init, rank=rank,
                            world_size=world)  # fmt: skip
    try:
        cases = CASES if world == 2 else FOUR
        out = {case: {"fsdp": train(case, fsdp), "ddp": train(case, ddp)} for case in cases}
        torch.save(out, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_engine_on_fsdp_shards_equals_ddp_on_gloo_ranks(tmp_path, world):
    mp.spawn(_worker, args=(world, rendezvous(tmp_path), str(tmp_path)), nprocs=world)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    for case in CASES if world == 2 else FOUR:
        routes = [results[r][case]["fsdp"][1]["routes"] for r in range(world)]
        assert all(r == routes[0] for r in routes), (case, routes)  # each rank's, the same
        for rank in range(world):
            (f, paths, reduces, norms), (d, ddp_paths, _, ddp_norms) = \
                results[rank][case]["fsdp"], results[rank][case]["ddp"]  # fmt: skip
            for n in d:
                torch.testing.assert_close(f[n], d[n], rtol=1e-12, atol=1e-14, msg=(case, n))
                assert torch.equal(f[n], results[0][case]["fsdp"][0][n]), (case, n, "ranks")
            # gradients that stay where they are: one launch list, kept; a second where the
            # fold merges with MARS's norm pass from the second step (its kernels differ)
            merged = case in ("mars-adamw", "mars-adamw:global", "mars-lion")
            built = paths.pop("built"), ddp_paths.pop("built")
            assert built == (1 + merged, 1 + merged), (case, built)
            ranks_routes, _ = paths.pop("routes"), ddp_paths.pop("routes")
            assert {r for _, r in ranks_routes} == {"engine"}, ranks_routes
            assert paths.get("engine", 0) >= STEPS, (case, paths)
            assert set(paths) == {"engine"} and set(ddp_paths) == {"engine"}, paths
            folds = [folded for _, folded in norms]
            assert folds == [True] * STEPS, case  # (MARS-M's matrices too: on the engine)
            assert all(f for _, f in ddp_norms), case  # DDP: every bucket on the engine
            for (a, _), (b, _) in zip(norms, ddp_norms):
                torch.testing.assert_close(a, b, rtol=1e-12, atol=0, msg=case)
            assert any(float(n) > MAX_NORM for n, _ in norms), case  # the clip fired
            # a step: one all-reduce for the MARS clip's norms, one for the folded global clip;
            # merged from the second step: one for both (MARS-M's pre-pass keeps its own norm
            # pass: two); MARS-M's matrices: two all-to-alls a shape, the same every step
            mars = case.startswith("mars-")
            expect = [mars + 1] + [1 if merged else mars + 1] * (STEPS - 1)
            assert [r for r, _ in reduces] == expect, (case, reduces)
            trips = {a for _, a in reduces}
            assert len(trips) == 1 and trips.pop() % 2 == 0, (case, reduces)
            assert (reduces[0][1] > 0) == (case == "mars-m"), (case, reduces)
