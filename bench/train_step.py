"""Time training steps (forward/backward over micro-batches + optimizer step) of a model preset.

    python -m bench.train_step                          # tiny model, CPU, micro-batch 1 2 4 8
    python -m bench.train_step --model gpt2-small --device cuda --micro-batch 8 16
    python -m bench.train_step --no-tune-allocator      # glibc's default allocator

Prints tokens/s (best of --steps timed steps after one warm-up step), MFU on GPUs with a known
peak, and the device. Run one configuration per process when comparing allocator settings:
--tune-allocator changes the process for good.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

import optim
from bench.harness import model_config
from model import build_model
from runtime.device import peak_flops, resolve_dtype, tune_host_allocator
from runtime.distributed import DistInfo, pick_device
from trainer.config import TrainConfig
from trainer.trainer import forward_backward


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="tiny", help="a configs/model/*.yaml preset")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--micro-batch", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--batch-seqs", type=int, default=16, help="sequences per optimizer step")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--tune-allocator", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--loss-chunk-tokens", type=int, default=TrainConfig.loss_chunk_tokens)
    args = ap.parse_args()

    cfg = model_config(args.model)
    device = pick_device(args.device, 0)
    dist = DistInfo(0, 0, 1, device)
    dtype = resolve_dtype("auto", device)
    tuned = device.type == "cpu" and args.tune_allocator and tune_host_allocator()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    print(
        f"device: {device} ({name or platform.machine()}), {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}, dtype {str(dtype).removeprefix('torch.')}, "
        f"allocator tuned: {bool(tuned)}, model {args.model}"
    )
    torch.manual_seed(0)
    model = build_model(cfg).to(device)
    model.loss_chunk_tokens = args.loss_chunk_tokens  # as training sets it (0: the plain loss)
    runner = torch.compile(model) if args.compile else model
    opt = optim.build_optimizer(model, optim.AdamWConfig())
    T = cfg.block_size
    peak = peak_flops(device)
    for mb in args.micro_batch:
        if args.batch_seqs % mb:
            raise SystemExit(f"--batch-seqs {args.batch_seqs} is not a multiple of {mb}")
        x = torch.randint(0, 50257, (mb, T), device=device)
        batches = [(x, x)] * (args.batch_seqs // mb)
        times = []
        for _ in range(args.steps + 1):
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            forward_backward(runner, batches, dist, dtype, 1.0 / len(batches))
            opt.step()
            opt.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        best = min(times[1:])
        tok_s = args.batch_seqs * T / best
        mfu = model.flops_per_token(T) * tok_s / peak if peak else None
        mfu_txt = f", MFU {100 * mfu:.1f}%" if mfu else ""
        print(
            f"micro-batch {mb:3d} x {T}: {tok_s:10,.0f} tokens/s ({best * 1e3:.0f} ms/step){mfu_txt}"
        )


if __name__ == "__main__":
    main()
