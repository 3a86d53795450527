"""Every registered optimizer on FSDP2-sharded parameters (optim/sharded.py, docs/fsdp-optimizers.md).

Two gloo processes on the CPU train a small model (an embedding, matrices whose first dim is odd
or 1, LayerNorm gains, biases) with ``fully_shard`` per layer and on the root, and the same model
under DDP; one process without either is the reference. Every rank sees the same batches, so the
averaged gradients equal the single process's bit for bit ((g + g) / 2 = g) and any difference
is the optimizer's. One spawn runs every optimizer (configs/optimizer/*.yaml, exact modes with
the reference pass the trainer runs).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

import optim
import optim.newton_schulz as ns
from helpers import rendezvous
from optim.sharded import owners

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs" / "optimizer"
CONFIGS = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
# Whole-matrix preconditioners on owner ranks: tested in float64 on a model where SOAP's
# eigenbases are well posed (tests/test_fsdp_whole_matrix.py): here, in float32 with default
# options, a last-bit difference turns SOAP's arbitrary null-space eigenbasis by 1e-3.
ELSEWHERE = {"soap", "mars-soap", "normuon"}
# case -> (config file, overrides): every config, and the other paths a sharded step may take
CASES = {stem: (stem, {}) for stem in CONFIGS if stem not in ELSEWHERE} | {
    "mars-adamw:global": ("mars-adamw", {"clip": "global"}),
    "mars-m-exact:global": ("mars-m-exact", {"clip": "global"}),
    "mars-shampoo:loop": ("mars-shampoo", {"implementation": "loop", "ns_dtype": "float32"}),
    "moonlight:float32": ("moonlight", {"ns_dtype": "float32"}),
}
STEPS = 6
VOCAB = 11
# Bit for bit where the arithmetic is the same: element-wise rules (AdamW, Lion). Within RTOL
# (relative norm of the difference) where it is not: a clip norm is a sum of squares in another
# order (sharded: the blocks' sums all-reduced), and Newton-Schulz batches other sets of matrices
# on an owner than one process does (a float32 batched matmul may round otherwise). Seen here:
# below 1e-6, and often bit for bit (bf16 Newton-Schulz and sign() absorb last-bit differences).
EXACT = {"adamw", "lion"}
RTOL = 1e-5
LOSS_SCALE = 30.0


def name_and_mode(stem: str) -> tuple[str, str]:
    return (stem.removesuffix("-exact"), "exact") if stem.endswith("-exact") else (stem, "approx")


class Tiny(nn.Module):
    """Matrices (9, 6), (9, 9) twice, (6, 9), (1, 6) (rank 1 holds none of its rows), (11, 6)."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, 6)
        self.fc1 = nn.Linear(6, 9)
        self.ln = nn.LayerNorm(9)
        self.fc2 = nn.Linear(9, 9, bias=False)
        self.fc3 = nn.Linear(9, 9, bias=False)
        self.fc4 = nn.Linear(9, 6, bias=False)
        self.gate = nn.Linear(6, 1)
        self.head = nn.Linear(6, VOCAB, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln(F.gelu(self.fc1(self.wte(x))))
        h = self.fc4(h + self.fc3(F.gelu(self.fc2(h))))
        return self.head(h) * torch.sigmoid(self.gate(h))


def batch(t: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + t)
    return torch.randint(0, VOCAB, (4, 5), generator=g), torch.randint(
        0, VOCAB, (4, 5), generator=g
    )


def forward_backward(model: nn.Module, t: int) -> None:
    """The loss is scaled up so that MARS's clip of c to norm <= 1 acts (it is not a no-op)."""
    x, y = batch(t)
    (LOSS_SCALE * F.cross_entropy(model(x).flatten(0, 1), y.flatten())).backward()


def build(case: str, model: nn.Module) -> torch.optim.Optimizer:
    stem, overrides = CASES[case]
    name, mode = name_and_mode(stem)
    spec = optim.get_spec(name)
    kw = {"mode": mode} if "mode" in spec.config_cls.__dataclass_fields__ else {}
    return optim.build_optimizer(model, spec.config_cls(name=name, **kw, **overrides))


def train(case: str, wrap=None) -> dict[str, torch.Tensor]:
    """STEPS steps of ``case`` on Tiny (``wrap``: FSDP or DDP); the whole parameters by name."""
    torch.manual_seed(0)
    model = Tiny()
    run = wrap(model) if wrap else model
    opt = build(case, model)
    for t in range(STEPS):
        optim.reference_pass(opt, lambda t=t: forward_backward(run, t + 1))  # as the Trainer
        forward_backward(run, t)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {n: _whole(p) for n, p in model.named_parameters()}


def _whole(p: torch.Tensor) -> torch.Tensor:
    full = getattr(p, "full_tensor", None)
    return (full() if full else p).detach().clone()


def fsdp(model: Tiny) -> Tiny:
    from torch.distributed.fsdp import fully_shard

    for child in model.children():
        fully_shard(child)
    return fully_shard(model)


def ddp(model: Tiny) -> nn.Module:
    return nn.parallel.DistributedDataParallel(model)


def unsupported_placement() -> str:
    """The error of an optimizer step on a replicated DTensor (not FSDP2's Shard(0))."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    p = nn.Parameter(distribute_tensor(torch.randn(4, 3), mesh, [Replicate()]))
    p.grad = distribute_tensor(torch.randn(4, 3), mesh, [Replicate()])
    try:
        optim.Muon([p]).step()
    except ValueError as e:
        return str(e)
    return "no error"


def _worker(rank: int, world: int, init: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank,
                            world_size=world)  # fmt: skip
    counted: list[int] = []
    iterate = ns.newton_schulz

    def count(x, *args, **kw):  # matrices orthogonalised on this rank
        counted.append(x.shape[0] if x.ndim == 3 else 1)
        return iterate(x, *args, **kw)

    ns.newton_schulz = count
    try:
        out = {"fsdp": {}, "ddp": {}, "ns": {}}
        for case in CASES:
            counted.clear()
            out["fsdp"][case] = train(case, fsdp)
            out["ns"][case] = sum(counted)
            out["ddp"][case] = train(case, ddp)
        out["error"] = unsupported_placement()
        torch.save(out, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def spawned(tmp_path_factory) -> list[dict]:
    """Both ranks' results: every optimizer under FSDP2 and DDP (one spawn for the module)."""
    out = tmp_path_factory.mktemp("fsdp")
    mp.spawn(_worker, args=(2, rendezvous(out), str(out)), nprocs=2)
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


def test_every_registered_optimizer_has_a_config_here():
    assert ELSEWHERE <= set(CONFIGS)
    assert sorted({name_and_mode(s)[0] for s in CONFIGS}) == optim.available()


def _assert_close(got: dict, want: dict, exact: bool, where: str) -> None:
    for n, w in want.items():
        if exact:
            assert torch.equal(got[n], w), (where, n, (got[n] - w).abs().max())
        else:
            rel = ((got[n] - w).norm() / w.norm()).item()
            assert rel <= RTOL, (where, n, rel)


@pytest.mark.slow
def test_fsdp_equals_one_process_and_ddp_for_every_optimizer(spawned):
    """Parameters after STEPS steps (the first included): FSDP2 on both ranks equals one process
    and DDP, bit for bit where no norm is taken (EXACT), else within RTOL (relative norm)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the workers: a matmul's reduction order depends on it
    try:
        wants = {case: train(case) for case in CASES}
    finally:
        torch.set_num_threads(threads)
    for case, want in wants.items():
        exact = name_and_mode(CASES[case][0])[0] in EXACT
        for rank, res in enumerate(spawned):
            _assert_close(res["fsdp"][case], want, exact, (case, rank, "fsdp vs one process"))
            _assert_close(res["fsdp"][case], res["ddp"][case], exact, (case, rank, "fsdp vs ddp"))


@pytest.mark.slow
def test_newton_schulz_is_split_over_the_ranks(spawned):
    """Each matrix is orthogonalised once, on its owner: the ranks' counts add up to one
    process's count, and each rank takes about half."""
    for case, (stem, _) in CASES.items():
        ranks = [res["ns"][case] for res in spawned]
        name = name_and_mode(stem)[0]
        if name not in ("muon", "moonlight", "mars-m", "mars-m-efficient", "mars-shampoo"):
            assert ranks == [0, 0], case
            continue
        matrices = 7 if name in ("muon", "mars-shampoo") else 6  # + the embedding (2-D)
        assert sum(ranks) == matrices * STEPS, (case, ranks)
        assert max(ranks) <= (matrices + 1) // 2 * STEPS, (case, ranks)


@pytest.mark.slow
def test_unsupported_placement_is_a_value_error_naming_it(spawned):
    for res in spawned:
        assert "Replicate()" in res["error"] and "Shard(0)" in res["error"], res["error"]


def test_owners_balance_by_cost_and_agree_on_every_rank():
    shapes = [(9, 6), (9, 9), (9, 9), (9, 6), (1, 6), (11, 6)]
    got = owners(shapes, 2)
    assert got == owners(list(shapes), 2)  # deterministic: a function of the shapes only
    assert got[1] != got[2]  # the two largest on different ranks
    assert sorted(set(got)) == [0, 1] and owners(shapes, 1) == [0] * 6
    assert owners([], 4) == []
