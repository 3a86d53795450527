"""How fast the study's proxy models train on this machine: the study's cost (docs/study.md,
"The proxy's speed"). A study instrument, not a benchmark: it says which micro-batch and thread
count the study runs with (configs/experiment/study.yaml).

    python -m study speed [--models proxy-100k proxy-200k] [--micro-batch 8 16 32]
                          [--optimizers adamw muon] [--threads 1 2]

Per (model, micro-batch, optimizer, threads) it times train.py's ``Trainer.train_step`` (on
random byte tokens) and prints tokens/s and the achieved GFLOP/s (model FLOPs 6N + 12LHQT per
token, N the multiplying parameters) against this machine's measured fp32 matmul rate at the
same thread count (the best of square matmuls of 256..1024), so it says how much of the CPU a
proxy uses and which micro-batch to run the study with. The process is set up as train.py sets
up a CPU run (runtime.device.configure_backends: glibc's allocator keeps freed memory: 3-5% more
tokens/s on the proxies here).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable

import torch

from data.loader import RandomBatches
from model import build_model
from optim import get_spec
from runtime.device import configure_backends
from runtime.distributed import DistInfo
from runtime.runfiles import cpu_name
from study.plan import model_config
from trainer.config import TrainConfig
from trainer.trainer import Trainer


def random_batches(cfg: TrainConfig) -> RandomBatches:
    """data.RandomBatches in place of the loader, as bench.train draws them (token ids below
    min(vocab, 50257))."""
    return RandomBatches(cfg.micro_batch_size, cfg.sequence_length,
                         min(cfg.model.vocab_size, 50257))  # fmt: skip


def best_time(fn: Callable[[], object], repeats: int) -> float:
    """The shortest wall-clock seconds of ``repeats`` calls (on the CPU: nothing to sync)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def matmul_gflops(sizes: tuple[int, ...] = (256, 512, 1024)) -> float:
    """The best fp32 GFLOP/s of an n x n matmul over ``sizes`` at the current thread count."""
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        reps = max(1, int(2e9 / (2 * n**3)))
        t = best_time(lambda a=a, b=b, r=reps: [a @ b for _ in range(r)], 5)
        best = max(best, 2 * n**3 * reps / t / 1e9)
    return best


def case(model: str, micro: int, opt: str, steps: int) -> tuple[float, float]:
    """(tokens/s, GFLOP/s) of one configuration's training step (best of ``steps``)."""
    m = model_config(model)
    cfg = TrainConfig(model=m, optimizer=get_spec(opt).config_cls(), micro_batch_size=micro,
                      batch_tokens=micro * m.block_size, device="cpu", dtype="float32",
                      loss_chunk_tokens=0, max_steps=10**6)  # fmt: skip
    trainer = Trainer(cfg, DistInfo(0, 0, 1, torch.device("cpu")), batches=random_batches(cfg))
    trainer.wrap()
    for _ in range(3):  # warm-up: allocator, first-step state
        trainer.train_step()
    t = best_time(trainer.train_step, steps)
    with torch.device("meta"):
        fpt = build_model(m).flops_per_token(m.block_size)
    tokens = cfg.batch_tokens / t
    return tokens, tokens * fpt / 1e9


def device_line() -> str:
    """The machine the speeds were measured on: its CPU, cores, threads, Python and torch."""
    return (f"device: cpu ({cpu_name()}), {os.cpu_count()} cores, {torch.get_num_threads()} "
            f"threads, Python {platform.python_version()}, torch {torch.__version__}")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m study speed", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--models", nargs="+", default=["proxy-100k", "proxy-200k"])
    ap.add_argument("--micro-batch", nargs="+", type=int, default=[8, 16, 32])
    ap.add_argument("--optimizers", nargs="+", default=["adamw", "muon"])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--steps", type=int, default=20, help="timed steps per case (best is kept)")
    args = ap.parse_args(argv)
    configure_backends(torch.device("cpu"))  # as train.py: the allocator tuned
    print(device_line())
    for threads in args.threads:
        torch.set_num_threads(threads)
        peak = matmul_gflops()
        print(f"threads {threads}: fp32 matmul {peak:.1f} GFLOP/s (best of 256..1024 square)")
        for model in args.models:
            for micro in args.micro_batch:
                for opt in args.optimizers:
                    tok, gf = case(model, micro, opt, args.steps)
                    print(f"  {model:11s} micro {micro:3d} {opt:10s} {tok:10,.0f} tokens/s "
                          f"{gf:6.2f} GFLOP/s ({100 * gf / peak:4.1f}% of matmul)")  # fmt: skip
