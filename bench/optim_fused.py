"""Time the optimizer step against torch's AdamW, in one process, on a model preset's tensors.

    python -m bench.optim_fused                                  # gpt2-small, CPU
    python -m bench.optim_fused --device cuda                    # adds AdamW(fused=True)
    python -m bench.optim_fused --only adamw mars-adamw mars-lion lion --rounds 5
    python -m bench.optim_fused --device cuda --grouping tensor  # vs the default (list)

Variants: torch AdamW(foreach=True) (and fused=True on CUDA) and each named optimizer of the core
on its foreach path and its compiled path (``fused=True``, optim/fused.py). Every variant steps the
same parameters and gradients (values drift; the time does not depend on them); the variants run
in turn, round after round, so a busy machine slows them alike. Prints the median ms/step, the
ratio to AdamW(foreach), the bytes a fused step must move per step (reads + writes, fp32) with the
effective GB/s, the first step's time of each compiled variant (the compile), and on CUDA the
device's copy bandwidth (a large tensor copy) and each variant's share of it.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

import optim
import optim.fused
from bench.harness import model_config
from model import build_model
from runtime.distributed import pick_device

# tensors a fused step reads + writes per parameter: p, g, state (and g_ref, plus the norm pass
# re-reading g and g_ref for the per-tensor clip)
PASSES = {"adamw": 7, "mars-adamw": 11, "mars-adamw-exact": 10, "mars-lion": 9, "lion": 5}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def build(name: str, params: list, fused: bool | None):
    """An optimizer over ``params`` (one group, weight decay 0.1 as GPT-2's matrices)."""
    if name == "adamw":
        kind = "fused" if fused else "foreach"
        return torch.optim.AdamW(params, lr=6e-4, weight_decay=0.1, **{kind: True})
    if name.startswith("mars-"):
        mars_type, exact = name.removesuffix("-exact"), name.endswith("-exact")
        return optim.MARS(params, lr=6e-3, weight_decay=0.1, mars_type=mars_type,
                          is_approx=not exact, fused=fused)  # fmt: skip
    if name == "lion":
        return optim.Lion(params, lr=2e-4, weight_decay=0.3, fused=fused)
    raise SystemExit(f"--only {name!r}: use adamw, mars-adamw, mars-adamw-exact, mars-lion, lion")


def one_step(opt, step: int) -> None:
    for group in opt.param_groups:  # a changing lr: the compiled step must not recompile
        group["lr"] = 1e-3 * (1 + 0.01 * (step % 7))
    if getattr(opt, "needs_reference_grad", False):
        opt.store_reference_grad()
    opt.step()


def copy_bandwidth(device: torch.device, n_bytes: int = 1 << 30) -> float:
    """GB/s of a large device-to-device copy (read + write counted)."""
    x = torch.empty(n_bytes // 4, device=device)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    sync(device)
    return 2 * n_bytes * 10 / (time.perf_counter() - t0) / 1e9


def variants(names: list[str], device: torch.device) -> list[tuple[str, str, bool | None]]:
    out = []
    for name in names:
        if name == "adamw":
            out.append(("torch AdamW foreach", name, False))
            if device.type == "cuda":
                out.append(("torch AdamW fused", name, True))
        else:
            out += [(f"{name} foreach", name, False), (f"{name} compiled", name, True)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="gpt2-small", help="a configs/model/*.yaml preset")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--only", nargs="*", default=["adamw", "mars-adamw"])
    ap.add_argument("--rounds", type=int, default=5, help="rounds over the variants")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per variant and round")
    ap.add_argument("--grouping", choices=["auto", "tensor", "list"], default="auto",
                    help="compiled call per tensor or per bucket (optim/fused.py GROUPING)")  # fmt: skip
    args = ap.parse_args()
    device = pick_device(args.device, 0)
    if args.grouping != "auto":
        optim.fused.GROUPING[device.type] = args.grouping
    model = build_model(model_config(args.model))
    params = [p for p in model.to(device).parameters()]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    n = sum(p.numel() for p in params)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    print(f"device: {device} ({name or platform.machine()}), torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")  # fmt: skip
    grouping = optim.fused.GROUPING.get(device.type, "list")
    print(f"model: {args.model}, {n / 1e6:.2f}M parameters in {len(params)} tensors; "
          f"compiled grouping: {grouping}")  # fmt: skip
    runs = variants(args.only, device)
    opts, times, first = {}, {label: [] for label, _, _ in runs}, {}
    for label, opt_name, fused in runs:  # first step: state creation and any compile
        opts[label] = build(opt_name, params, fused)
        sync(device)
        t0 = time.perf_counter()
        one_step(opts[label], 0)
        sync(device)
        first[label] = time.perf_counter() - t0
        print(f"  {label}: first step (state, any compile) {first[label]:.2f} s", flush=True)
    for r in range(args.rounds):
        for label, _, _ in runs:
            for s in range(args.steps):
                sync(device)
                t0 = time.perf_counter()
                one_step(opts[label], 1 + r * args.steps + s)
                sync(device)
                times[label].append(time.perf_counter() - t0)
    report(runs, times, first, n, copy_bandwidth(device) if device.type == "cuda" else None)


def report(runs, times, first, n: int, copy_gbs: float | None) -> None:
    base = statistics.median(times[runs[0][0]])
    head = f"{'variant':<28}{'ms/step':>10}{'x AdamW':>9}{'MB moved':>10}{'GB/s':>8}"
    print(head + ("" if copy_gbs is None else f"{'% copy':>8}") + f"{'1st step s':>12}")
    for label, opt_name, _ in runs:
        t = statistics.median(times[label])
        moved = PASSES[opt_name] * 4 * n
        line = f"{label:<28}{t * 1e3:>10.1f}{t / base:>9.2f}{moved / 1e6:>10.0f}{moved / t / 1e9:>8.1f}"
        if copy_gbs is not None:
            line += f"{100 * moved / t / 1e9 / copy_gbs:>8.0f}"
        print(line + f"{first[label]:>12.2f}")
    if copy_gbs is not None:
        print(f"device copy bandwidth: {copy_gbs:.0f} GB/s (1 GiB copy, read + write)")
    print(f"medians of {len(times[runs[0][0]])} steps per variant, variants interleaved")


if __name__ == "__main__":
    main()
