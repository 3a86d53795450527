"""Time one optimizer step (no forward/backward) of every registered optimizer on a model preset.

    python -m bench.optim                                   # tiny model, CPU
    python -m bench.optim --model gpt2-small --device cuda  # the papers' smallest model
    python -m bench.optim --only mars-adamw adamw --implementations loop foreach
    python -m bench.optim --model gpt2-small --only adamw muon normuon --set ns_dtype=float32

Prints milliseconds per step (median of --steps after --warmup steps), the optimizer state in
bytes per parameter, and the device. Each optimizer can be timed on several of its
implementations (optim/implementation.py), e.g. its per-tensor loop and its foreach path
(--implementations loop foreach); a value an optimizer does not have is left out for it.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
import time

import torch

import optim
from bench.harness import model_config
from model import build_model
from runtime.distributed import pick_device
from trainer.memory_plan import state_bytes


def time_steps(model, opt, device, steps: int, warmup: int) -> float:
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    times = []
    for i in range(warmup + steps):
        if getattr(opt, "needs_reference_grad", False):
            opt.store_reference_grad()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="tiny", help="a configs/model/*.yaml preset")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--only", nargs="*", default=None, help="optimizer names (default: all)")
    ap.add_argument("--exact", action="store_true", help="also time the exact modes")
    ap.add_argument("--implementations", nargs="+", default=None, metavar="IMPL",
                    help="time each optimizer on each of these where it has it: auto, loop, "
                    "foreach, compiled, triton (torch's AdamW: torch-fused)")  # fmt: skip
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="options for the optimizers that have them, e.g. ns_dtype=float32 "
                    "(Newton-Schulz in fp32: CPUs without bf16 matmul units run bf16 ~70x slower)")  # fmt: skip
    args = ap.parse_args()
    import yaml

    given = {}
    for item in args.set:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise SystemExit(f"bench.optim: --set {item!r}: write KEY=VALUE, e.g. ns_dtype=float32")
        given[key] = yaml.safe_load(value)
    device = pick_device(args.device, 0)
    model = build_model(model_config(args.model)).to(device)
    n = sum(p.numel() for p in model.parameters())
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    print(f"device: {device} ({name or platform.machine()}), torch {torch.__version__}")
    print(f"model: {args.model}, {n / 1e6:.2f}M parameters")
    print(f"{'optimizer':<34}{'ms/step':>10}{'state B/param':>15}")
    for opt_name in args.only or optim.available():
        cls = optim.get_spec(opt_name).config_cls
        fields = {f.name for f in dataclasses.fields(cls)}
        own = {k: v for k, v in given.items() if k in fields}
        variants = [("".join(f" {k}={v}" for k, v in own.items()), own)]
        if args.exact and "mode" in fields:
            variants.append((variants[0][0] + " exact", {**own, "mode": "exact"}))
        if args.implementations:
            variants = [(s + f" {how}", {**kw, "implementation": how}) for s, kw in variants
                        for how in args.implementations
                        if how in cls.valid_implementations]  # fmt: skip
        for suffix, kw in variants:
            opt = optim.build_optimizer(model, cls(**kw))
            ms = time_steps(model, opt, device, args.steps, args.warmup)
            print(f"{opt_name + suffix:<34}{ms:>10.2f}{state_bytes(opt) / n:>15.1f}")
            del opt


if __name__ == "__main__":
    main()
