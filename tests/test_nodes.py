"""Several nodes (trainer/shared_fs.py, docs/training.md "Several nodes"): a run directory or data
directory that the nodes do not share is one clear error on every rank, not a hang; and two
torchrun "nodes" on this machine (c10d rendezvous on localhost, gloo) give the numbers of one
node with two processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp
from test_fsdp import assert_close_metrics, metrics

from helpers import FAST, ROOT, free_port, rendezvous
from trainer import shared_fs


def _check(rank: int, init: str, root: str, case: str) -> str:
    """Rank ``rank``'s outcome of check_shared_files when the ranks see ``case``'s directories."""
    import torch

    from data.config import DataConfig
    from runtime.distributed import DistInfo

    shared_fs.WAIT_S = 0.5
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank,
                            world_size=2)  # fmt: skip
    base = Path(root)
    out = base / ("out" if case != "out_dir" else f"out{rank}")  # node-local run dirs
    data = base / ("data" if case != "data" else f"data{rank}")
    data.mkdir(parents=True, exist_ok=True)
    if rank == 0 or case != "data":  # the other node has no shards
        for name in ("x_train_000001.bin", "x_val_000000.bin"):
            (data / name).write_bytes(b"0" * 8)
    dist.barrier()
    cfg = DataConfig(dir=str(data), train_pattern="*_train_*.bin", val_pattern="*_val_*.bin")
    try:
        shared_fs.check_shared_files(DistInfo(rank, rank, 2, torch.device("cpu")), out, cfg)
        outcome = "ok"
    except SystemExit as exc:
        outcome = str(exc)
    finally:
        dist.destroy_process_group()
    (base / f"{case}.rank{rank}").write_text(outcome)


def _worker(rank: int, init: str, root: str) -> None:
    for i, case in enumerate(("shared", "out_dir", "data")):
        _check(rank, f"{init}-{i}", f"{root}/{case}", case)  # a new group, a new file


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("nodes")
    mp.spawn(_worker, args=(rendezvous(root), str(root)), nprocs=2)
    found = {
        case: [(root / case / f"{case}.rank{r}").read_text() for r in range(2)]
        for case in ("shared", "out_dir", "data")
    }
    return {**found, "root": root}


@pytest.mark.slow
def test_shared_directories_pass_and_leave_no_marker(outcomes):
    assert outcomes["shared"] == ["ok", "ok"]
    out = outcomes["root"] / "shared" / "out"
    assert out.is_dir() and not list(out.glob(f"{shared_fs.MARKER_PREFIX}*"))


@pytest.mark.slow
def test_unshared_run_dir_is_one_error_on_every_rank_naming_it(outcomes):
    first, second = outcomes["out_dir"]
    assert first == second  # every rank stops, with the same line: nobody waits in a collective
    assert "out_dir" in first and "out0 is not one directory shared by every node" in first
    assert "rank 1 (host " in first and "Several nodes" in first and "\n" not in first


@pytest.mark.slow
def test_unshared_data_dir_is_one_error_naming_it(outcomes):
    first, second = outcomes["data"]
    assert first == second and "data.dir" in first and "data0 differs between the nodes" in first
    assert "rank 1 (host " in first and "sees no token shards" in first


def test_problems_are_described_from_the_findings():
    ok = {"host": "a", "error": None, "out_dir": True, "data": [("x", 8)]}
    assert shared_fs.describe_problems([ok, {**ok, "host": "b"}], Path("/r"), "/d") == ""
    other = {**ok, "host": "b", "data": [("y", 8)]}
    line = shared_fs.describe_problems([ok, other], Path("/r"), "/d")
    assert line.startswith("data.dir /d differs") and "rank 1 (host b) sees other token" in line
    broken = {**ok, "error": "rank 0 cannot write to out_dir /r: denied"}
    assert shared_fs.describe_problems([broken, ok], Path("/r"), "/d").startswith("rank 0 cannot")


# --- two torchrun "nodes" on this machine -----------------------------------------------------


def _torchrun(launcher: list[str], args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", *launcher, "train.py", *args]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def _finish(proc: subprocess.Popen) -> None:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out + err[-4000:]


@pytest.mark.slow
def test_two_nodes_give_the_single_node_numbers(tmp_path, sotu_dir):
    """``--nnodes=2 --nproc_per_node=1`` with c10d rendezvous on localhost (two agents, as on two
    machines) against ``--standalone --nproc_per_node=2``: the same losses and grad norms."""
    args = [*FAST, f"data.dir={sotu_dir}", "max_steps=4", "micro_batch_size=2", "eval_every=2"]
    _finish(
        _torchrun(["--standalone", "--nproc_per_node=2"], [*args, f"out_dir={tmp_path / 'one'}"])
    )
    port = free_port()
    node = ["--nnodes=2", "--nproc_per_node=1", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=localhost:{port}", "--rdzv-id=two-nodes"]  # fmt: skip
    nodes = [_torchrun(node, [*args, f"out_dir={tmp_path / 'two'}"]) for _ in range(2)]
    for proc in nodes:
        _finish(proc)
    one, two = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    assert len(one) == 4 + 4 + 2  # train loss and grad norm at 4 steps, val loss at 2 and 4
    assert_close_metrics(one, two, 1e-6)
