"""Defects a first GPU hour would hit, caught on the CPU (docs/gpu-readiness.md)."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from count_compiles import count_compiles
from torch.utils._python_dispatch import TorchDispatchMode

from data import val_batches
from model import GPT, GPTConfig
from model.loss import linear_cross_entropy
from runtime.device import check_torch, peak_flops_of
from runtime.distributed import DistInfo
from trainer import checkpoint as ckpt
from trainer import dcp_checkpoint, evaluation
from trainer import meter as meter_mod
from trainer import trainer as trainer_mod
from trainer.config import TrainConfig
from trainer.dcp_checkpoint import DcpCheckpointer, load_dcp
from trainer.meter import Meter
from trainer.run import RunState
from trainer.trainer import Trainer, ddp_bucket_cap_mb, regions_under_ddp

TINY = dict(block_size=16, vocab_size=96, n_layer=2, n_head=2, n_embd=32)
CPU1 = DistInfo(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


class _CountCasts(TorchDispatchMode):
    """Counts dtype casts (``aten._to_copy``) of one tensor."""

    def __init__(self, tensor: torch.Tensor) -> None:
        super().__init__()
        self.ptr, self.count = tensor.data_ptr(), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if func is torch.ops.aten._to_copy.default and args[0].data_ptr() == self.ptr:
            self.count += 1
        return func(*args, **(kwargs or {}))


# Item 8: the small ones.


def test_h100_nvl_peak_is_its_dense_bf16():
    assert peak_flops_of("NVIDIA H100 NVL") == 835e12
    assert peak_flops_of("NVIDIA H100 80GB HBM3") == 989e12


def test_head_weight_is_cast_once_per_loss_call():
    h = torch.randn(64, 16, requires_grad=True)
    w = torch.randn(50, 16, requires_grad=True)
    y = torch.randint(0, 50, (64,))
    with torch.autocast("cpu", dtype=torch.bfloat16), _CountCasts(w) as casts:
        loss = linear_cross_entropy(h, w, y, chunk=8)  # 8 chunks
    loss.backward()
    assert casts.count == 1
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        with _CountCasts(w) as casts:
            linear_cross_entropy(h, w, y, chunk=8)
    assert casts.count == 1


def _save(tmp_path, model, dcp: bool):
    opt = torch.optim.AdamW(model.parameters())
    loader = type("L", (), {"state_dict": lambda self: {"consumed": 0}})()
    state = type("S", (), dict(step=1, tokens=0, best_val_loss=None, last_val_loss=None,
                               last_train_loss=None, skipped_steps=0, nonfinite_in_a_row=0,
                               stopped=None, stop_message=None))()  # fmt: skip
    saver = DcpCheckpointer(asynchronous=False) if dcp else None
    ckpt.save_training_state(tmp_path, model, opt, loader, state, config={}, dist=CPU1,
                             keep=0, elapsed=lambda: 0.0, dcp_saver=saver)  # fmt: skip
    return ckpt.latest_checkpoint(tmp_path)


def test_tied_weight_is_stored_once_and_old_checkpoints_load(tmp_path):
    torch.manual_seed(0)
    cfg = GPTConfig(**{**TINY, "vocab_size": 4096})  # the tied matrix dominates the state
    model = GPT(cfg)
    unique = sum(p.numel() * p.element_size() for p in model.parameters())
    path = _save(tmp_path / "dcp", model, dcp=True)
    stored = load_dcp(path)["model"]
    assert "lm_head.weight" not in stored and len(stored) == len(list(model.parameters()))
    written = sum(f.stat().st_size for f in path.glob("*.distcp"))
    head = model.lm_head.weight.nbytes
    assert unique <= written < unique + head // 2  # the (vocab, n_embd) matrix once, not twice
    path = _save(tmp_path / "file", model, dcp=False)
    stored = ckpt.load_checkpoint(path)["model"]
    assert "lm_head.weight" not in stored
    for state in (stored, model.state_dict()):  # new checkpoints, and old ones with both keys
        fresh = GPT(cfg)
        ckpt.load_model_state(fresh, state, "test")
        assert fresh.lm_head.weight is fresh.transformer.wte.weight
        assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters()))


# Item 1: the torch version, checked at start-up; missing features fall back with a reason.


@pytest.mark.parametrize("found", ["2.4.1", "1.13.0+cu117"])
def test_old_torch_stops_with_one_line(monkeypatch, found):
    monkeypatch.setattr(torch, "__version__", found)
    with pytest.raises(SystemExit, match=rf"torch {re.escape(found)} .*needs torch 2\.5 or newer"):
        check_torch()
    with pytest.raises(SystemExit, match="needs torch 2.5"):  # the Trainer checks first
        Trainer(None, None)


@pytest.mark.parametrize("found", ["2.5.0", "2.6.0a0+git1234", "2.13.0+cpu", "3.0.0"])
def test_supported_torch_passes(monkeypatch, found):
    monkeypatch.setattr(torch, "__version__", found)
    assert check_torch() == found


def _old_async_save(state_dict, *, checkpoint_id=None, storage_writer=None, planner=None,
                    process_group=None):  # fmt: skip
    raise AssertionError("torch 2.7's async_save cannot take our call")


def test_async_save_without_stager_falls_back_with_a_reason(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(dcp_checkpoint.dcp, "async_save", _old_async_save)
    model = torch.nn.Linear(8, 8)
    with caplog.at_level(logging.WARNING):
        saver = DcpCheckpointer(asynchronous=True)
    assert "async_stager or no_dist" in caplog.text and "background thread" in caplog.text
    saver.save(tmp_path, 1, {"model": model.state_dict()}, {"step": 1}, lambda final: None)
    saver.close()
    loaded = load_dcp(tmp_path / "step_0000001", parts=("model",))
    assert all(torch.equal(v, loaded["model"][k]) for k, v in model.state_dict().items())
    assert dcp_checkpoint.async_save_fallback() != ""
    monkeypatch.undo()
    assert dcp_checkpoint.async_save_fallback() == ""  # this torch takes the call


def test_compiled_regions_under_ddp_turn_the_ddp_optimizer_off():
    # torch's config module through its own patch(): pytest's monkeypatch would delete the
    # option on undo (the config module's delattr), breaking every later compile
    with torch._dynamo.config.patch(optimize_ddp=True):
        regions_under_ddp()
        assert torch._dynamo.config.optimize_ddp is False
    assert torch._dynamo.config.optimize_ddp is not False  # restored for the tests after


@pytest.mark.slow
def test_trainer_layout_under_ddp_is_one_graph_per_block_with_attention_inside():
    """bench.graphs counts the Trainer's own layout (regions, then DDP, one gloo rank): the
    embeddings, one block for all, the final norm, the head; no break; SDPA inside the block.
    With DDPOptimizer on, DDP's 1 MB first bucket cuts the blocks into more graphs."""
    from bench.graphs import count_trainer_graphs

    cfg = GPTConfig(
        block_size=32,
        vocab_size=64,
        n_layer=3,
        n_head=2,
        n_embd=384,
        scale_attn_by_inverse_layer_idx=True,
    )  # a block holds 6.75 MiB
    ours = count_trainer_graphs(cfg)
    assert ours == {"graphs": 4, "breaks": 0, "sdpa_in_graph": True}, ours
    cut = count_trainer_graphs(cfg, ddp_optimizer=True, bucket_cap_mb=1.0)
    assert cut["graphs"] > ours["graphs"], cut
    import torch.distributed as dist

    assert not dist.is_initialized()  # the one-rank group it made is gone (later tests need none)


# Item 3: the first step (compilation) is out of the throughput; no progress bar off a terminal.


class _Records:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def log(self, row: dict) -> None:
        self.rows.append(row)


def _meter(monkeypatch, clock: list[float], stderr=None) -> tuple[Meter, RunState, _Records]:
    monkeypatch.setattr(meter_mod.time, "perf_counter", lambda: clock[0])
    if stderr is not None:
        monkeypatch.setattr(meter_mod.sys, "stderr", stderr)
    state, records = RunState(), _Records()
    cfg = TrainConfig(max_steps=10)
    cfg.batch_tokens = 1000  # a round count for the meter (no batch is drawn here)
    return Meter(cfg, CPU1, state, records, 1.0, lambda: 0.0), state, records


def test_first_step_is_left_out_of_tokens_per_second(monkeypatch):
    clock = [0.0]
    meter, state, records = _meter(monkeypatch, clock)
    zero = torch.zeros(())
    for seconds in (100.0, 1.0, 1.0):  # the first step compiles
        clock[0] += seconds
        state.step += 1
        meter.step(zero)
        if state.step == 1:
            meter.log(zero, zero, 1e-3)  # a log line before any timed step
    meter.log(zero, zero, 1e-3)
    meter.close()
    assert records.rows[0]["tokens_per_s"] is None and records.rows[0]["mfu"] is None
    assert records.rows[1]["tokens_per_s"] == pytest.approx(1000.0)  # 2 steps in 2 s


def test_timer_restarts_after_one_device_sync(monkeypatch):
    """The window after step 1 starts once step 1's queued GPU work is done: one sync, at the
    restart, before the clock is read (issue 27, item 8)."""
    clock, calls = [0.0], []
    meter, state, _ = _meter(monkeypatch, clock)
    monkeypatch.setattr(meter_mod, "sync_device", lambda d: calls.append((d, clock[0])))
    zero = torch.zeros(())
    for _ in range(4):
        clock[0] += 1.0
        state.step += 1
        meter.step(zero)
    meter.close()
    assert calls == [(CPU1.device, 1.0)] and meter.t0 == 1.0


def test_sync_device_waits_on_cuda_only(monkeypatch):
    waited = []
    monkeypatch.setattr(meter_mod.torch.cuda, "synchronize", lambda d=None: waited.append(d))
    meter_mod.sync_device(torch.device("cpu"))
    assert waited == []
    meter_mod.sync_device(torch.device("cuda", 1))
    assert waited == [torch.device("cuda", 1)]


def test_no_progress_bar_when_stderr_is_not_a_terminal(monkeypatch):
    meter, _, _ = _meter(monkeypatch, [0.0], stderr=io.StringIO())
    assert meter.bar.disable
    meter.close()
    tty = io.StringIO()
    tty.isatty = lambda: True
    meter, _, _ = _meter(monkeypatch, [0.0], stderr=tty)
    assert not meter.bar.disable
    meter.close()


# Item 6: asynchronous checkpoints stage into one flat buffer per dtype, reused across saves.


def test_staging_is_one_flat_buffer_per_dtype_reused(caplog):
    state = {
        "a": torch.randn(3, 5),
        "b": torch.randn(7),
        "step": torch.tensor(4.0),  # 0-d, as the optimizers' step counters
        "ids": torch.arange(6).view(2, 3),
    }
    saver = DcpCheckpointer(asynchronous=True)
    with caplog.at_level(logging.INFO):
        staged = saver.stage(state)
    assert "checkpoint staging: 140 bytes in 2 flat CPU buffer(s)" in caplog.text
    assert all(torch.equal(staged[k], v) and staged[k] is not v for k, v in state.items())
    assert {d: b.numel() for d, b in saver.flat.items()} == {torch.float32: 23, torch.int64: 6}
    assert saver.staged_bytes == 23 * 4 + 6 * 8
    for v in staged.values():  # views of their dtype's one buffer
        assert v.untyped_storage().data_ptr() == saver.flat[v.dtype].untyped_storage().data_ptr()
    first = saver.flat[torch.float32].data_ptr()
    state["a"].add_(1.0)
    staged = saver.stage(state)  # the next save: same buffers, fresh values
    assert saver.flat[torch.float32].data_ptr() == first and torch.equal(staged["a"], state["a"])
    saver.close()


# Item 2: fixed shapes; every rank runs the same validation batches and compiles the same graphs.


def test_padded_validation_batches_have_one_shape_and_count(sotu_dir, tmp_path):
    files = sorted(sotu_dir.glob("*_val_*.bin"))
    shapes = []
    for rank in range(3):  # 31 windows: 11, 10 and 10 per rank, batches of 4
        got = list(val_batches(files, batch_size=4, seq_len=32, rank=rank, world_size=3,
                               max_tokens=31 * 32))  # fmt: skip
        shapes.append([tuple(x.shape) for x, _ in got])
        real = sum(int((y != -1).all(dim=1).sum()) for _, y in got)
        assert real == (11 if rank == 0 else 10)
        assert all(int(x[(y == -1).all(dim=1)].abs().sum()) == 0 for x, y in got)  # padding: 0
    assert shapes[0] == shapes[1] == shapes[2] == [(4, 32)] * 3


def test_padded_validation_loss_equals_the_unpadded_one(sotu_dir, monkeypatch):
    files = sorted(sotu_dir.glob("*_val_*.bin"))
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=32, vocab_size=50304, n_layer=1, n_head=2, n_embd=16))
    totals = []
    monkeypatch.setattr(evaluation, "all_reduce_sum", lambda t: totals.append(t.clone()) or t)

    def loss(pad: bool, world_size: int) -> float:
        totals.clear()
        for rank in range(world_size):
            batches = val_batches(files, batch_size=4, seq_len=32, rank=rank, pad=pad,
                                  world_size=world_size, max_tokens=31 * 32)  # fmt: skip
            evaluation.validation_loss(model, batches, torch.device("cpu"), torch.float32)
        total = sum(totals)
        return (total[0] / total[1]).item()

    plain = loss(False, 1)
    assert loss(True, 1) == plain
    assert loss(True, 3) == loss(False, 3) == pytest.approx(plain, rel=1e-6)  # padding-only batch


def test_compiled_run_compiles_a_fixed_number_of_graphs(tmp_path, sotu_dir):
    """Evaluations with a short last batch (31 windows in batches of 4) add no graph: the same
    graphs however many steps and evaluations the run has, all of the micro-batch's shape."""
    uneven = ["eval_tokens=992", "eval_every=2"]
    short = count_compiles(tmp_path / "a", sotu_dir, "max_steps=2", *uneven)
    longer = count_compiles(tmp_path / "b", sotu_dir, "max_steps=6", *uneven)
    assert short == longer and len(longer) <= 10, longer
    assert not any([3, 32] in graph or [3, 32, 32] in graph for graph in longer)


@pytest.mark.slow
def test_two_ranks_compile_the_same_graphs(tmp_path, sotu_dir):
    """2 gloo ranks with validation windows split unevenly (31: 16 and 15)."""
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    script = Path(__file__).parent / "count_compiles.py"
    out = tmp_path / "two"
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(script), str(out), str(sotu_dir), "max_steps=4", "eval_tokens=992",
           "eval_every=2"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = [json.loads((out / f"compiles_{r}.json").read_text()) for r in range(2)]
    assert ranks[0] == ranks[1] and len(ranks[0]) <= 12, ranks


# Item 4: DDP buckets of at least one block (one compiled piece per block, not five), and the
# gradients as views of the buckets.


def test_bucket_cap_holds_one_block():
    def cap(n_layer: int, n_embd: int) -> float:
        with torch.device("meta"):
            cfg = GPTConfig(n_layer=n_layer, n_head=n_embd // 64, n_embd=n_embd)
            return ddp_bucket_cap_mb(GPT(cfg))

    xl_block = (12 * 1600**2 + 2 * 1600) * 4 / 2**20  # fp32: 4 matrices, 2 LayerNorm gains
    assert cap(48, 1600) == pytest.approx(xl_block) and 117 < xl_block < 118
    assert cap(12, 768) == pytest.approx((12 * 768**2 + 2 * 768) * 4 / 2**20)  # 27 MiB
    assert cap(2, 64) == 25.0  # never below DDP's default
    assert ddp_bucket_cap_mb(torch.nn.Linear(2, 2)) == 25.0


def test_wrap_gives_ddp_the_block_bucket_and_bucket_views(monkeypatch):
    seen = {}

    def fake_ddp(module, **kwargs):  # noqa: ANN001, ANN003, ANN202
        seen.update(kwargs)
        return module

    monkeypatch.setattr(trainer_mod, "DDP", fake_ddp)
    wrapper = Trainer.__new__(Trainer)  # only what wrap() reads
    wrapper.cfg = TrainConfig(compile=False)
    wrapper.dist = DistInfo(rank=0, local_rank=0, world_size=2, device=torch.device("cpu"))
    wrapper.raw_model = GPT(GPTConfig(**TINY))
    wrapper.wrap()
    from trainer.trainer import no_buffer_sync

    assert seen == {
        "device_ids": None,
        "bucket_cap_mb": 25.0,
        "gradient_as_bucket_view": True,
        **no_buffer_sync(),
    }
    assert list(no_buffer_sync().values()) == [False]


# Item 5: compiled region by region; blocks alike share one graph.


def _count_backend(graphs: list):
    def counting(gm, example_inputs):  # noqa: ANN001, ANN202
        graphs.append(len(example_inputs))
        return gm.forward

    return counting


@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("n_layer", [4, 8])
def test_regional_compile_shares_block_graphs_and_equals_eager(scaled, n_layer):
    torch._dynamo.reset()
    cfg = GPTConfig(**{**TINY, "n_layer": n_layer, "scale_attn_by_inverse_layer_idx": scaled})
    torch.manual_seed(0)
    eager, compiled = GPT(cfg), GPT(cfg)
    compiled.load_state_dict(eager.state_dict())
    graphs: list = []
    compiled.compile_regions(backend=_count_backend(graphs), dynamic=False)
    x = torch.randint(0, 96, (2, 16))
    for model in (eager, compiled):
        _, loss = model(x, x)
        loss.backward()
    assert torch.equal(eager(x, x)[1], compiled(x, x)[1])
    for a, b in zip(eager.parameters(), compiled.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)
    # the embeddings, one block for all of them (the per-layer scale too: a buffer, attention
    # inside the graph), the final LayerNorm and the head
    assert len(graphs) == 4
    assert set(compiled.state_dict()) == set(eager.state_dict())  # no _orig_mod. prefixes
