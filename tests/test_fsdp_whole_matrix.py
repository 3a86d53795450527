"""SOAP, MARS-SOAP and NorMuon on FSDP2 shards (optim/soap.py, optim/normuon.py, optim/sharded.py
``on_owners``; docs/fsdp-optimizers.md), on 2 and 4 gloo processes, float64.

tests/test_optim_fsdp.py's small model with its gate on the hidden state (uneven row blocks; a
matrix of which a rank holds no row; 1-D gains; an embedding and a head of one shape) trained
with ``fully_shard`` and with DDP: FSDP2 equals one process and DDP to 1e-12 (seen: 1e-16, and
the per-tensor loop bit for bit), SOAP's batched path (the default) and its loop (``:loop``),
NorMuon in float64 Newton-Schulz. ``max_precond_dim=6`` preconditions only the dimensions whose
GG_i is of full rank from the first step (a matrix's smaller side, at most 6): the eigenbasis of a
rank-deficient GG (the larger side of a non-square matrix) is arbitrary within its null space,
so a last-bit difference (a MARS clip norm summed over row blocks; an owner batching other
matrices than one process) changes it, and the parameters by 1e-3 within 5 steps; one process's
batched path differs from its own loop as much there. A DCP save of the sharded optimizer state (the trainer's writer, trainer/dcp_checkpoint.py) read
back whole and resharded (trainer/fsdp.py ``rebuild_optimizer``) continues the uninterrupted run;
the state of a sharded parameter is sharded (SOAP's GG_i and Q_i, NorMuon's row moments).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from test_optim_fsdp import Tiny, ddp, forward_backward, fsdp

import optim
from helpers import rendezvous

pytestmark = pytest.mark.slow
STEPS, SAVED = 5, 2  # the basis step, then Adam in the eigenbasis; a power iteration at 3 (freq 2)
RTOL = 1e-12


def loop_kw(cls) -> dict:
    """The per-tensor loop, by whichever name the config calls it."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {"implementation": "loop"} if "implementation" in names else {"foreach": False}


SOAP = {"precondition_frequency": 2, "max_precond_dim": 6}
CASES = {  # case -> (registry name, overrides)
    "soap": ("soap", SOAP),
    "soap:loop": ("soap", {**SOAP, "loop": True}),
    "soap:merged:loop": (
        "soap",
        {
            "merge_dims": True,
            "max_precond_dim": 6,
            "loop": True,
            "precondition_1d": True,
            "normalize_grads": True,
        },
    ),  # fmt: skip
    "mars-soap": ("mars-soap", SOAP),
    "mars-soap:loop": ("mars-soap", {**SOAP, "loop": True}),
    "normuon": ("normuon", {"ns_dtype": "float64"}),
}

ON_FOUR = ("soap", "mars-soap", "normuon")  # the 4-rank run: the default paths (time)


def build(case: str, model) -> torch.optim.Optimizer:
    name, overrides = CASES[case]
    cls = optim.get_spec(name).config_cls
    kw = dict(overrides)
    if kw.pop("loop", False):
        kw |= loop_kw(cls)
    return optim.build_optimizer(model, cls(name=name, **kw))


def whole(model) -> dict:
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in model.named_parameters()}  # fmt: skip


def steps(model, run, opt, first: int, last: int) -> None:
    for t in range(first, last):
        forward_backward(run, t)
        opt.step()
        opt.zero_grad(set_to_none=True)


class Model(Tiny):
    """Tiny with its gate on the 9-wide hidden state: matrices (9, 6), (9, 9) twice, (6, 9),
    (1, 9) and (11, 6) twice; with ``max_precond_dim=6`` every GG_i is of full rank (docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(9, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln(torch.nn.functional.gelu(self.fc1(self.wte(x))))
        gate = torch.sigmoid(self.gate(h))
        h = self.fc4(h + self.fc3(torch.nn.functional.gelu(self.fc2(h))))
        return self.head(h) * gate


def new_model(case: str) -> nn.Module:
    return Model().double()


def train(case: str, wrap=None) -> dict:
    torch.manual_seed(0)
    model = new_model(case)
    run = wrap(model) if wrap else model
    opt = build(case, model)
    steps(model, run, opt, 0, STEPS)
    return whole(model)


def placements(opt) -> dict:
    """Each state tensor's kind: ``sharded`` (a DTensor) or ``plain``."""
    return {(i, k): "sharded" if hasattr(v, "full_tensor") else "plain"
            for i, p in enumerate(q for g in opt.param_groups for q in g["params"])
            for k, v in opt.state[p].items() if isinstance(v, torch.Tensor) and v.ndim}  # fmt: skip


def resumed(case: str, ckpt: str) -> dict:
    """SAVED steps under FSDP2, a DCP save as the trainer writes it, then a fresh model and
    optimizer loaded from it whole, sharded (as the trainer resumes) and trained on."""
    from trainer.dcp_checkpoint import DcpCheckpointer, load_dcp
    from trainer.fsdp import rebuild_optimizer

    torch.manual_seed(0)
    model = new_model(case)
    run = fsdp(model)
    opt = build(case, model)
    steps(model, run, opt, 0, SAVED)
    kinds = placements(opt)
    saver = DcpCheckpointer(asynchronous=False, rank=dist.get_rank(),
                            world_size=dist.get_world_size())  # fmt: skip
    path = saver.save(__import__("pathlib").Path(ckpt), SAVED,
                      {"model": model.state_dict(), "optimizer": opt.state_dict()}, {},
                      lambda final: None)  # fmt: skip
    saver.close()
    state = load_dcp(path)
    torch.manual_seed(1)  # other weights: everything comes from the checkpoint
    fresh = new_model(case)
    fresh.load_state_dict({k: v.double() for k, v in state["model"].items()})
    old = build(case, fresh)
    old.load_state_dict(state["optimizer"])
    run = fsdp(fresh)
    new = rebuild_optimizer(old, lambda: build(case, fresh))
    steps(fresh, run, new, SAVED, STEPS)
    return {"params": whole(fresh), "kinds": kinds, "kinds_resumed": placements(new)}


def _worker(rank: int, world: int, init: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank,
                            world_size=world)  # fmt: skip
    try:
        cases = CASES if world == 2 else ON_FOUR
        out = {case: {"fsdp": train(case, fsdp), "ddp": train(case, ddp)} for case in cases}
        if world == 2:
            for case in ("soap", "normuon"):
                out[case]["resumed"] = resumed(case, f"{out_dir}/ckpt-{case}")
        torch.save(out, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def spawn(tmp_path_factory, world: int) -> list[dict]:
    out = tmp_path_factory.mktemp(f"whole{world}")
    mp.spawn(_worker, args=(world, rendezvous(out), str(out)), nprocs=world)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> list[dict]:
    return spawn(tmp_path_factory, 2)


@pytest.fixture(scope="module")
def four(tmp_path_factory) -> list[dict]:
    return spawn(tmp_path_factory, 4)


@pytest.fixture(scope="module")
def single() -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the workers
    try:
        return {case: train(case) for case in CASES}
    finally:
        torch.set_num_threads(threads)


def assert_close(got: dict, want: dict, where) -> None:
    for n, w in want.items():
        rel = ((got[n] - w).norm() / w.norm()).item()
        assert rel <= RTOL, (where, n, rel)


def check(ranks: list[dict], single: dict) -> None:
    for case in ranks[0]:
        for r, res in enumerate(ranks):
            assert_close(res[case]["fsdp"], single[case], (case, r, "fsdp vs one process"))
            assert_close(res[case]["fsdp"], res[case]["ddp"], (case, r, "fsdp vs ddp"))
            for n, v in res[case]["fsdp"].items():  # every rank ends with the same weights
                assert torch.equal(v, ranks[0][case]["fsdp"][n]), (case, r, n)


def test_fsdp_equals_ddp_and_one_process_on_two_ranks(two, single):
    check(two, single)


def test_fsdp_equals_ddp_and_one_process_on_four_ranks(four, single):
    """4 ranks: a (1, 6) matrix on one rank, several ranks that own nothing of a shape."""
    check(four, single)


def test_dcp_save_and_resume_continue_the_run(two, single):
    for case in ("soap", "normuon"):
        for r, res in enumerate(two):
            got = res[case]["resumed"]
            assert_close(got["params"], single[case], (case, r, "resumed vs one process"))
            assert_close(got["params"], res[case]["fsdp"], (case, r, "resumed vs fsdp"))
            # every state tensor of a sharded parameter is sharded, before and after the resume
            assert set(got["kinds"].values()) == {"sharded"}, got["kinds"]
            assert got["kinds_resumed"] == got["kinds"]
    soap_keys = {k for (_, k) in two[0]["soap"]["resumed"]["kinds"]}
    assert {"GG0", "Q0", "GG1", "Q1", "exp_avg_sq", "exp_avg"} <= soap_keys
    assert "second_momentum_buffer" in {k for (_, k) in two[0]["normuon"]["resumed"]["kinds"]}
