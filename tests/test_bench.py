"""The benchmarks' harness: one config reader, a fresh compile per measurement, the DDP graph
pieces, and bench.gpu_check's plan and CPU mode."""

import argparse
import subprocess
import sys

import pytest
import torch

from bench.configs import load_config
from helpers import ROOT


def test_load_config_composes_experiments():
    exp = load_config("experiment/owt/small-mars-adamw-exact")
    assert exp["model"]["n_layer"] == 12 and exp["model"]["name"] == "gpt2-small"
    assert exp["optimizer"]["name"] == "mars-adamw" and exp["optimizer"]["mode"] == "exact"
    assert exp["batch_tokens"] == 491_520 and exp["micro_batch_size"] == 15
    assert load_config("experiment/fineweb-edu/xl-adamw")["model"]["n_embd"] == 1600
    with pytest.raises(ValueError, match="gpt2-small"):
        load_config("model/gpt2-huge")


def test_each_measurement_compiles_its_own_static_graphs(monkeypatch):
    """Two model sizes in one process: without the reset the second recompiles (dynamic)."""
    import bench.train as bt
    from runtime.distributed import DistInfo

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda m, **kw: real(m, backend="eager"))
    args = argparse.Namespace(micro_batch=2, seq_len=16, compile=True, dtype="float32",
                              activation_checkpointing=False, warmup=1, steps=1, nanogpt=None)  # fmt: skip
    dist = DistInfo(0, 0, 1, torch.device("cpu"))
    counts = []
    for model in ("tiny", "tiny-wide"):
        cfg = bt.train_config(args, "tiny", optimizer_cfg(), 4096, torch.device("cpu"))
        if model == "tiny-wide":
            cfg.model = type(cfg.model)(**{**vars(cfg.model), "n_embd": 2 * cfg.model.n_embd})
        case = dict(model=model, chunk=4096, opt="adamw", cfg=cfg)
        bt.run_case(case, args, dist, keep=False)
        counts.append(case["counters"])
    assert all(c["graphs"] >= 1 and c["recompiles"] == 0 for c in counts), counts


def optimizer_cfg():
    import optim

    return optim.AdamWConfig()


def test_bucket_cap_keeps_a_block_per_piece():
    from bench.graphs import count_ddp_pieces
    from model import GPT, GPTConfig
    from trainer.trainer import ddp_bucket_cap_mb

    cfg = GPTConfig(block_size=32, vocab_size=64, n_layer=3, n_head=2, n_embd=384)
    many = count_ddp_pieces(cfg, 1.0)  # DDP's first-bucket size; a block holds 6.75 MiB
    ours = count_ddp_pieces(cfg, ddp_bucket_cap_mb(GPT(cfg)))
    assert many > cfg.n_layer >= ours >= 1, (many, ours)
    import torch.distributed as dist

    assert not dist.is_initialized()  # the one-rank group it made is gone (later tests need none)


def test_gpu_check_dry_run_lists_every_step():
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry-run"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for step in ("gpu-tests", "train-small", "xl", "optim-fused", "newton-schulz", "checkpoint"):
        assert f"{step} (" in proc.stdout
    assert "--models gpt2-xl --optimizers adamw mars-adamw --micro-batch" in proc.stdout


def test_gpu_check_records_failures_and_goes_on(tmp_path):
    from bench import gpu_check

    steps = [
        gpu_check.Step("fails", "exit 3", [sys.executable, "-c", "import sys; sys.exit(3)"], 30),
        gpu_check.Step("slow", "sleeps", [sys.executable, "-c", "import time; time.sleep(30)"], 1),
        gpu_check.Step("fine", "prints", [sys.executable, "-c", "print('tokens/s 1')"], 30),
    ]
    results = [gpu_check.run_step(s, s.limit_s) for s in steps]
    assert [r["status"] for r in results] == ["failed", "timed out after 1 s", "ok"]
    text = gpu_check.report(results, "device: cpu")
    assert "| fails | failed |" in text and "tokens/s 1" in text and "torch " in text


def test_gpu_check_cpu_mode(tmp_path):
    out = tmp_path / "report.md"
    proc = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--cpu", "--only",
                           "xl-estimate", "--out", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = out.read_text()
    assert "device: cpu" in text and "| xl-estimate | ok |" in text and "activations" in text
