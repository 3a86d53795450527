"""Cost of the per-step non-finite check (trainer/nonfinite.py): training steps with the check
decided on the host (``nonfinite.decision=host``: one tiny all-reduce and one host sync per step)
and on the device (``device``: the optimizer masks its writes on ``found_inf``, the flags are
read a step late; where the optimizer supports it) against without (``policy=off``),
interleaved in one process so that all see the same machine.

    python -m bench.nonfinite                                   # tiny model, CPU
    python -m bench.nonfinite --model gpt2-small --device cuda --micro-batch 16 --accum 4

Each round times ``--steps`` back-to-back steps (forward/backward over ``--accum`` micro-batches,
the global grad-norm clip, the check, the optimizer step) with one device sync at the end only,
so the check's sync is the only one inside a round: exactly what it costs a run. Prints the
median ms/step of each variant over ``--rounds`` rounds of each and their ratio.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

import torch

import optim
from model import GPTConfig, build_model
from runtime.config_files import load_config
from runtime.device import resolve_dtype
from runtime.distributed import DistInfo, pick_device
from trainer.nonfinite import NonFiniteConfig, NonFiniteGuard
from trainer.run import RunState
from trainer.trainer import forward_backward

ROOT = Path(__file__).resolve().parent.parent


def load_yaml(group: str, name: str) -> dict:
    """configs/<group>/<name>.yaml (runtime.config_files); one clear line for an unknown name."""
    try:
        return load_config(f"{group}/{name}")
    except ValueError as e:
        raise SystemExit(str(e)) from None


def time_round(step, steps: int, device: torch.device) -> float:
    """Milliseconds per step over ``steps`` back-to-back steps, synced once at the end."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="tiny", help="a configs/model/*.yaml preset")
    ap.add_argument("--optimizer", default="mars-adamw", help="a configs/optimizer/*.yaml")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    ap.add_argument("--steps", type=int, default=10, help="steps per timed round")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of each variant")
    args = ap.parse_args()

    cfg = GPTConfig(**load_yaml("model", args.model))
    opt_values = load_yaml("optimizer", args.optimizer)
    opt_cfg = optim.get_spec(opt_values["name"]).config_cls(**opt_values)
    device = pick_device(args.device, 0)
    dist, dtype = DistInfo(0, 0, 1, device), resolve_dtype("auto", device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    print(f"device: {device} ({name or platform.machine()}), {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}, model {args.model}, optimizer {args.optimizer}, "
          f"micro-batch {args.micro_batch} x {cfg.block_size} x {args.accum}")  # fmt: skip
    torch.manual_seed(0)
    model = build_model(cfg).to(device)
    opt = optim.build_optimizer(model, opt_cfg)
    x = torch.randint(0, 50257, (args.micro_batch, cfg.block_size), device=device)
    batches = [(x, x)] * args.accum
    guards = {}
    for variant, policy, decision in (("off", "off", "host"), ("host", "skip", "host"),
                                      ("device", "skip", "device")):  # fmt: skip
        config = NonFiniteConfig(policy=policy, decision=decision)
        try:
            guards[variant] = NonFiniteGuard(config, dist, RunState(), ROOT, 0, optimizer=opt)
        except ValueError as e:  # the optimizer cannot skip on a device flag (non-fused AdamW)
            print(f"decision=device: not measured ({e})")

    def make_step(guard: NonFiniteGuard):
        def step() -> None:
            optim.reference_pass(opt, lambda: forward_backward(model, batches, dist, dtype, 1.0))
            loss = forward_backward(model, batches, dist, dtype, 1.0 / args.accum)
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if guard.allows_step(loss, norm):
                opt.step()
            opt.zero_grad(set_to_none=True)

        return step

    steps = {variant: make_step(g) for variant, g in guards.items()}
    for step in steps.values():
        time_round(step, 2, device)  # warm-up (the device variant compiles its masked step)
    opt.found_inf = None
    times: dict[str, list[float]] = {variant: [] for variant in steps}
    for _ in range(args.rounds):
        for variant, step in steps.items():
            opt.found_inf = None  # only the device variant sets it, every step
            times[variant].append(time_round(step, args.steps, device))
    medians = {variant: statistics.median(t) for variant, t in times.items()}
    for variant, median in medians.items():
        rounds = ", ".join(f"{t:.2f}" for t in times[variant])
        print(f"{variant:<6}: {median:9.2f} ms/step (rounds: {rounds})")
    for variant in ("host", "device"):
        if variant in medians:
            print(f"{variant} / off : {medians[variant] / medians['off']:.4f}")


if __name__ == "__main__":
    main()
