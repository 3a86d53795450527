"""Time Newton-Schulz per optimizer step on GPT-2 matrix shapes, one matrix at a time vs batched,
and its share of a MARS-M (or Muon) optimizer step.

    python -m bench.newton_schulz --model gpt2-small --layers 1 --steps 2  # CPU, short
    python -m bench.newton_schulz --model gpt2-xl --layers 1 --steps 1 --warmup 0
    python -m bench.newton_schulz --device cuda --model gpt2-small gpt2-xl  # bf16, full

Shapes come from configs/model/<model>.yaml without building the model: per block c_attn
(3n, n), attn c_proj (n, n), c_fc (4n, n), mlp c_proj (n, 4n) (the block matrices that MARS-M,
Moonlight and Muon's recommended routing put on Newton-Schulz), and for the AdamW part wte
(vocab, n), wpe (block, n) and the LayerNorm gains. ``--layers K`` times K blocks (every block
has the same shapes) and scales the block figures by n_layer / K for the per-step numbers; the
AdamW part is timed whole. Reported, median over ``--steps`` (A/B interleaved in one process):

- NS one-at-a-time / batched: ``orthogonalise`` of the block matrices (optim/newton_schulz.py);
- step: the optimizer's full step on the block matrices (batched NS) plus the AdamW part;
- rest: the same step with NS replaced by the identity (the element-wise parts); NS share =
  (step - rest) / step.

NS runs in ``--ns-dtype`` (auto: bfloat16 on CUDA, as the official codes; float32 on CPU, where
bf16 matmuls are emulated and several times slower). CUDA timings synchronise around each call.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

import optim.preconditioners as precond
from optim import MARS_M, Muon
from optim.newton_schulz import orthogonalise
from runtime.config_files import load_config
from runtime.distributed import pick_device


def model_spec(name: str) -> dict:
    return load_config(f"model/{name}")


def block_shapes(spec: dict, layers: int) -> list[tuple[int, int]]:
    n = spec["n_embd"]
    return [(3 * n, n), (n, n), (4 * n, n), (n, 4 * n)] * layers


def adamw_shapes(spec: dict) -> list[tuple[int, ...]]:
    n = spec["n_embd"]
    return [(spec["vocab_size"], n), (spec["block_size"], n)] + [(n,)] * (2 * spec["n_layer"] + 1)


def params_with_grads(shapes, device) -> list[torch.nn.Parameter]:
    ps = [torch.nn.Parameter(torch.randn(s, device=device) * 0.02) for s in shapes]
    for p in ps:
        p.grad = torch.randn_like(p) * 1e-3
    return ps


def make_optimizer(name: str, matrices, others, ns_dtype: str):
    if name == "muon":
        return Muon(matrices, adamw_params=others, ns_dtype=ns_dtype)
    return MARS_M(lr=3e-3, muon_params=matrices, adamw_params=others, ns_dtype=ns_dtype)


def timed(fn, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def identity_ns(us, **_):
    return us


def step_without_ns(opt) -> None:
    real, precond.orthogonalise = precond.orthogonalise, identity_ns
    try:
        opt.step()
    finally:
        precond.orthogonalise = real


def bench(model: str, args, device, dtype: torch.dtype) -> None:
    spec = model_spec(model)
    layers = min(args.layers or spec["n_layer"], spec["n_layer"])
    scale = spec["n_layer"] / layers
    matrices = params_with_grads(block_shapes(spec, layers), device)
    others = params_with_grads(adamw_shapes(spec), device)
    us = [p.grad for p in matrices]
    ns_kw = dict(steps=5, eps=1e-7, dtype=dtype, distributed=False)
    dname = str(dtype).removeprefix("torch.")
    opt_m = make_optimizer(args.optimizer, matrices, None, dname)
    opt_a = make_optimizer(args.optimizer, [], others, dname)
    cases = {
        "ns_single": lambda: orthogonalise(us, batched=False, **ns_kw),
        "ns_batched": lambda: orthogonalise(us, batched=True, **ns_kw),
        "step_blocks": opt_m.step,
        "rest_blocks": lambda: step_without_ns(opt_m),
        "step_adamw": opt_a.step,
    }
    times = {k: [] for k in cases}
    for i in range(args.warmup + args.steps):
        for key, fn in cases.items():  # interleaved: the machine's load hits every case alike
            t = timed(fn, device)
            if i >= args.warmup:
                times[key].append(t * 1e3)
    ms = {k: statistics.median(v) for k, v in times.items()}
    report(model, spec, layers, scale, len(us), ms)


def report(model, spec, layers, scale, count, ms) -> None:
    ns_b, ns_s = ms["ns_batched"] * scale, ms["ns_single"] * scale
    step = ms["step_blocks"] * scale + ms["step_adamw"]
    rest = ms["rest_blocks"] * scale + ms["step_adamw"]
    print(f"\n{model}: n_layer {spec['n_layer']}, n_embd {spec['n_embd']}; timed {layers} "
          f"block(s), {count} matrices; per-step figures x{scale:g}")  # fmt: skip
    for k, v in ms.items():
        print(f"  measured {k:<12} {v:10.1f} ms")
    print(f"  per step: NS one-at-a-time {ns_s:.1f} ms, batched {ns_b:.1f} ms "
          f"(speed-up x{ns_s / ns_b:.2f})")  # fmt: skip
    print(f"  per step: optimizer step {step:.1f} ms, of which NS {step - rest:.1f} ms "
          f"({100 * (step - rest) / step:.1f}%), element-wise rest {rest:.1f} ms")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", nargs="+", default=["gpt2-small", "gpt2-xl"])
    ap.add_argument("--optimizer", choices=["mars-m", "muon"], default="mars-m")
    ap.add_argument("--layers", type=int, default=0, help="blocks to time (0: all)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--ns-dtype", default="auto", help="auto: bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.layers < 0:
        raise SystemExit("--steps must be >= 1, --warmup and --layers >= 0")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device, 0)
    name = args.ns_dtype
    if name == "auto":
        name = "bfloat16" if device.type == "cuda" else "float32"
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise SystemExit(f"--ns-dtype {name!r}: use auto, bfloat16, float32")
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    print(f"device: {device} ({gpu or platform.processor() or platform.machine()}), "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, NS in {name}, "
          f"optimizer {args.optimizer}, steps {args.steps}, warmup {args.warmup}")  # fmt: skip
    for model in args.model:
        bench(model, args, device, dtype)


if __name__ == "__main__":
    main()
