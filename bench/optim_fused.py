"""Time the optimizer step against torch's AdamW, in one process, on a model preset's tensors.

    python -m bench.optim_fused                                  # gpt2-small, CPU
    python -m bench.optim_fused --device cuda                    # adds torch's fused AdamW
    python -m bench.optim_fused --only adamw mars-adamw mars-lion lion --rounds 5
    python -m bench.optim_fused --device cuda --grouping tensor  # vs the default (list)
    python -m bench.optim_fused --device cuda --only adamw mars-adamw muon --paths foreach engine \
        --kernels --clip 1.0                                     # the engine, kernels per step

Variants: torch AdamW(foreach=True) (and fused=True on CUDA) and each named optimizer on each of
``--paths``: ``foreach`` (``implementation="foreach"``), ``compiled`` (``"compiled"``,
optim/compiled.py; the element-wise families of the core only) and ``engine`` (``"triton"``,
optim/engine/; the
default on CUDA, on a CPU only when named: Triton's interpreter is slow). Families: adamw,
mars-adamw, mars-adamw-exact, mars-lion, lion, ademamix, adamw-schedulefree, muon, mars-m. Every
variant steps the same parameters and gradients (values drift; the time does not depend on
them); the variants run in turn, round after round, so a busy machine slows them alike. Prints
the median ms/step, the ratio to AdamW(foreach) and to torch's fused AdamW (CUDA), the bytes an
element-wise step must move per step (reads + writes, fp32; "-" for Newton-Schulz families) with
the effective GB/s, the first step's time of each variant (compiles), and on CUDA the device's
copy bandwidth (a large tensor copy) and each variant's share of it; with ``--kernels`` (CUDA)
the GPU kernels of one step (torch's profiler: kernels, copies and memsets it records). With
``--clip MAX_NORM`` each step is the trainer's: the global gradient clip first, folded into the
engine where the optimizer can (optim/engine/clip.py), else ``clip_grad_norm_``, inside the time
and the kernel count (the gradients are scaled in place then: values drift, times do not); the bytes
moved count each tensor's passes by its rule (a MARS family's 1-D tensors are AdamW's), the
clip's as taken (folded: one read of g, none beyond MARS's own where the fold merged with MARS's
norm pass; ``clip_grad_norm_``: three) and exact mode's reference store (``moved_bytes``).
``--out DIR`` writes one record per variant (bench/record.py ``measurement``, kind
``optim-step``), rewritten after every round so that a run cut off keeps what it measured: each
round's median ms, every step's, the bytes moved, the device's copy bandwidth, the first step,
and with ``--kernels`` the profiler's kernels and their summed GPU time a step beside the wall
time. ``--block N``: the engine's block size for this process (optim/engine/launch.py
``set_block``; the GPU check times 4096, 2048 and 1024, each in processes of their own).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

import optim
import optim.compiled
from bench.harness import model_config
from model import build_model
from optim.core import VarianceReduced
from optim.rule import Rule
from runtime.distributed import pick_device

# tensors an element-wise step reads + writes per parameter of its rule: p, g, state (and
# g_ref, plus the norm pass reading g and g_ref for MARS's per-tensor clip: 2 of mars-adamw's
# 11, update 9); None: Newton-Schulz does more. The MARS families' tensors without the
# correction (1-D: the official code's AdamW) move ``PASSES["adamw"]``.
PASSES = {"adamw": 7, "mars-adamw": 11, "mars-adamw-exact": 10, "mars-lion": 9, "lion": 5,
          "ademamix": 9, "adamw-schedulefree": 7, "muon": None, "mars-m": None}  # fmt: skip
# what ``one_step`` adds: exact mode's reference store (reads g, writes the stored gradient);
# the trainer's clip folded into the engine (one norm pass: reads g; merged with MARS's norm
# pass, optim/engine/clip.py: reads g and g_ref once for both, so nothing beyond MARS's own
# passes) or torch's ``clip_grad_norm_`` (reads g for the norm, then reads and writes g)
EXACT_STORE, CLIP_PASSES = 2, {None: 0, "fold": 1, "torch": 3}


def passes(name: str, clip: str | None, corrected: bool = True, merged: bool = False) -> int | None:
    """Tensors a step of ``name`` reads + writes per parameter, as ``one_step`` runs it: the
    optimizer's own passes, exact mode's reference store and the trainer's clip (``clip``:
    None, ``"fold"`` or ``"torch"``); None for Newton-Schulz families. ``corrected``: a
    tensor with MARS's correction (else a MARS family's AdamW tensor); ``merged``: its fold
    merged with MARS's norm pass."""
    own = PASSES[name]
    if own is None:
        return None
    if name.startswith("mars-") and not corrected:
        return PASSES["adamw"] + CLIP_PASSES[clip]
    return own + (EXACT_STORE if name.endswith("-exact") else 0) + \
        (0 if merged else CLIP_PASSES[clip])  # fmt: skip


def moved_bytes(opt, name: str, clip: str | None) -> int:
    """The bytes one step of ``opt`` (the last one ``one_step`` ran) reads and writes, per
    tensor by its rule (``passes``): a MARS family's corrected tensors and its AdamW ones, the
    fold merged or not (the step's ``engine_state.sums``: the merged tensors' state dicts);
    0 for Newton-Schulz families."""
    engine = getattr(opt, "engine_state", None)
    sums = engine.sums if engine is not None and clip == "fold" else None
    merged = set() if sums is None else set(sums.index)
    view_of = getattr(opt, "rule_view", None)
    total = 0
    for group in opt.param_groups:
        for p in group["params"]:
            corrected = view_of is None or bool(view_of(p, group)[1].get("variance_reduction"))
            n = passes(name, clip, corrected, id(opt.state.get(p)) in merged)
            total += (n or 0) * p.numel() * p.element_size()
    return total


COMPILED = ("mars-adamw", "mars-adamw-exact", "mars-lion", "lion")  # with a compiled path
# --paths -> the optimizer's implementation (optim/implementation.py)
IMPLEMENTATION = {"foreach": "foreach", "compiled": "compiled", "engine": "triton"}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def build(name: str, params: list, how, model=None):
    """An optimizer over ``params`` (one group, weight decay 0.1 as GPT-2's matrices; the Muon
    family: ``model``'s parameters routed by the registry, its default config). ``how``: an
    implementation (optim/implementation.py); torch's AdamW: True its fused kernel."""
    if name == "adamw":
        kind = "fused" if how is True else "foreach"
        return torch.optim.AdamW(params, lr=6e-4, weight_decay=0.1, **{kind: True})
    if name.startswith("mars-") and name != "mars-m":
        mars_type, exact = name.removesuffix("-exact"), name.endswith("-exact")
        return optim.MARS(params, lr=6e-3, weight_decay=0.1, mars_type=mars_type,
                          is_approx=not exact, implementation=how)  # fmt: skip
    if name == "lion":
        return optim.Lion(params, lr=2e-4, weight_decay=0.3, implementation=how)
    if name == "ademamix":
        keys = Rule(momentum="ema", preconditioner="ademamix").group_keys()
        group = dict(params=params, lr=1e-3, betas=(0.9, 0.999), weight_decay=0.1, **keys)
        return VarianceReduced([group], implementation=how)
    if name == "adamw-schedulefree":
        return optim.AdamWScheduleFree(params, lr=2.5e-3, weight_decay=0.1, implementation=how)
    if name in ("muon", "mars-m") and model is not None:  # the registry's routing
        return optim.build_optimizer(model, optim.get_spec(name).config_cls(implementation=how))
    raise SystemExit(f"--only {name!r}: use {', '.join(PASSES)}")


def one_step(opt, step: int, clip: float | None = None) -> None:
    for group in opt.param_groups:  # a changing lr: the compiled step must not recompile
        group["lr"] = 1e-3 * (1 + 0.01 * (step % 7))
    if getattr(opt, "needs_reference_grad", False):
        opt.store_reference_grad()
    if clip is not None:  # the trainer's clip (trainer/trainer.py clip_grads)
        params = [p for g in opt.param_groups for p in g["params"]]
        fold = getattr(opt, "fold_grad_clip", None)
        if fold is None or fold(clip, params) is None:
            torch.nn.utils.clip_grad_norm_(params, clip)
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


def variants(names: list[str], device: torch.device, paths: list[str]) -> list[tuple]:
    out = []
    for name in names:
        if name == "adamw":
            out.append(("torch AdamW foreach", name, False))
            if device.type == "cuda":
                out.append(("torch AdamW fused", name, True))
            continue
        for path in paths:
            if path != "compiled" or name in COMPILED:
                out.append((f"{name} {path}", name, IMPLEMENTATION[path]))
    return out


def kernels_per_step(opt, device: torch.device, clip: float | None = None,
                     steps: int = 3) -> tuple[int | None, float | None]:  # fmt: skip
    """The GPU kernels (and copies, memsets) of one step, as torch's profiler records them, and
    their summed GPU time in ms a step (the mean over ``steps`` profiled steps): the time the
    device spent in the step's kernels, beside the wall time that adds launches and gaps."""
    if device.type != "cuda":
        return None, None
    from torch.profiler import ProfilerActivity, profile

    sync(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            one_step(opt, 1 + i, clip)
        sync(device)
    on_gpu = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy_us = sum(e.time_range.elapsed_us() for e in on_gpu)
    return len(on_gpu) // steps, busy_us / steps / 1e3


def main() -> None:
    args = parse_args()
    if args.processes > 1:  # each in a process of its own (Triton's and torch's state differ)
        import sys

        from bench.record import in_processes

        raise SystemExit(in_processes("bench.optim_fused", sys.argv[1:], args.processes))
    device = pick_device(args.device, 0)
    if args.grouping != "auto":
        optim.compiled.GROUPING[device.type] = args.grouping
    if args.block is not None:  # the engine's block size for this process
        from optim.engine import launch

        launch.set_block(args.block, device.type)
    model = build_model(model_config(args.model)).to(device)
    params = [p for p in model.parameters()]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    n = sum(p.numel() for p in params)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    print(f"device: {device} ({name or platform.machine()}), torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")  # fmt: skip
    grouping = optim.compiled.GROUPING.get(device.type, "list")
    print(f"model: {args.model}, {n / 1e6:.2f}M parameters in {len(params)} tensors; "
          f"compiled grouping: {grouping}")  # fmt: skip
    paths = args.paths or (["foreach", "compiled", "engine"] if device.type == "cuda" else
                           ["foreach", "compiled"])  # fmt: skip
    runs = variants(args.only, device, paths)
    opts, times, first, kernels, clips = {}, {label: [] for label, _, _ in runs}, {}, {}, {}
    kernel_ms, records = {}, {}
    copy_gbs = copy_bandwidth(device) if device.type == "cuda" else None
    for label, opt_name, fused in runs:  # first step: state creation and any compile
        opts[label] = build(opt_name, params, fused, model)
        sync(device)
        t0 = time.perf_counter()
        one_step(opts[label], 0, args.clip)
        sync(device)
        first[label] = time.perf_counter() - t0
        if args.kernels:
            kernels[label], kernel_ms[label] = kernels_per_step(opts[label], device, args.clip)
        clips[label] = clip_route(opts[label], args.clip)
        print(f"  {label}: first step (state, any compile) {first[label]:.2f} s", flush=True)
    for r in range(args.rounds):
        for label, _, _ in runs:
            for s in range(args.steps):
                sync(device)
                t0 = time.perf_counter()
                one_step(opts[label], 1 + r * args.steps + s, args.clip)
                sync(device)
                times[label].append(time.perf_counter() - t0)
            if args.out:  # this variant's record, with this round: written before the next
                m = moved_bytes(opts[label], name_of(runs, label), clips[label])
                records[label] = keep(args, device, label, runs, times[label], m, clips[label],
                                      kernels.get(label), kernel_ms.get(label), copy_gbs,
                                      first[label], records.get(label))  # fmt: skip
    moved = {label: moved_bytes(opts[label], o, clips[label]) for label, o, _ in runs}
    report(runs, times, first, moved, copy_gbs, kernels)


def clip_route(opt, clip: float | None) -> str | None:
    """How ``one_step`` clipped: None (no clip), ``"fold"`` or ``"torch"``."""
    if clip is None:
        return None
    folded = getattr(opt, "fold_grad_clip", None) and opt.clip_fold_off_reason is None
    return "fold" if folded else "torch"


def name_of(runs: list[tuple], label: str) -> str:
    return next(o for lb, o, _ in runs if lb == label)


def keep(args, device, label, runs, times, moved, clip, kernels, kernel_ms, copy_gbs, first,
         path=None):  # fmt: skip
    """One variant's record (bench/record.py ``measurement``, kind ``optim-step``): each round
    so far, its median ms; every step's ms. Returns its path (rewritten by the next round)."""
    from bench import record
    from optim.engine import launch
    from optim.engine.loader import warps

    n = args.steps
    rounds = [statistics.median(times[r * n : (r + 1) * n]) * 1e3 for r in range(len(times) // n)]
    engine = next(how for lb, _, how in runs if lb == label) == "triton"
    block = launch.BLOCKS[device.type] if engine else None
    path = record.measurement(
        path or args.out, "optim-step", device, rounds=rounds, unit="ms", variant=label,
        optimizer=name_of(runs, label), model=args.model, block=block,
        warps=warps(block) if block else None, bytes_moved=moved, clip=clip, kernels=kernels,
        kernel_ms=kernel_ms, copy_gbs=copy_gbs, first_step_s=first, steps_per_round=n,
        step_ms=[t * 1e3 for t in times], process=args.process)  # fmt: skip
    return path


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="gpt2-small", help="a configs/model/*.yaml preset")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--only", nargs="*", default=["adamw", "mars-adamw"])
    ap.add_argument(
        "--paths",
        nargs="+",
        choices=list(IMPLEMENTATION),
        default=None,
        help="default: foreach compiled engine on CUDA, foreach compiled elsewhere",
    )
    ap.add_argument("--kernels", action="store_true", help="count one step's GPU kernels (CUDA)")
    ap.add_argument("--clip", type=float, default=None, metavar="MAX_NORM",
                    help="the trainer's global clip in every step (folded on the engine)")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=5, help="rounds over the variants")
    ap.add_argument("--out", default=None, help="directory (or .json file) of the raw record")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per variant and round")
    ap.add_argument(
        "--block",
        type=int,
        default=None,
        help="the engine's block size (optim/engine/launch.py set_block)",
    )
    ap.add_argument("--process", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument(
        "--processes",
        type=int,
        default=1,
        help="run the benchmark this many times, each in its own process",
    )
    ap.add_argument(
        "--grouping",
        choices=["auto", "tensor", "list"],
        default="auto",
        help="compiled call per tensor or per bucket (optim/fused.py GROUPING)",
    )
    return ap.parse_args()  # fmt: skip


def report(runs, times, first, moved: dict, copy_gbs: float | None, kernels: dict) -> None:
    base = statistics.median(times[runs[0][0]])
    fused = next((statistics.median(times[lb]) for lb, o, f in runs if o == "adamw" and f), None)
    head = f"{'variant':<30}{'ms/step':>10}{'x AdamW':>9}"
    head += "" if fused is None else f"{'x fused':>9}"
    head += f"{'MB moved':>10}{'GB/s':>8}" + ("" if copy_gbs is None else f"{'% copy':>8}")
    print(head + f"{'1st step s':>12}" + (f"{'kernels':>9}" if kernels else ""))
    for label, _, _ in runs:
        t = statistics.median(times[label])
        line = f"{label:<30}{t * 1e3:>10.2f}{t / base:>9.2f}"
        line += "" if fused is None else f"{t / fused:>9.2f}"
        if moved[label]:
            line += f"{moved[label] / 1e6:>10.0f}{moved[label] / t / 1e9:>8.1f}"
            line += "" if copy_gbs is None else f"{100 * moved[label] / t / 1e9 / copy_gbs:>8.0f}"
        else:
            line += f"{'-':>10}{'-':>8}" + ("" if copy_gbs is None else f"{'-':>8}")
        line += f"{first[label]:>12.2f}"
        print(line + (f"{kernels.get(label) or '-':>9}" if kernels else ""))
    if copy_gbs is not None:
        print(f"device copy bandwidth: {copy_gbs:.0f} GB/s (1 GiB copy, read + write)")
    print(f"medians of {len(times[runs[0][0]])} steps per variant, variants interleaved")


if __name__ == "__main__":
    main()
