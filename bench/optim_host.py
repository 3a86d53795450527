"""The optimizer's host time per step, with the device work stubbed out.

    python -m bench.optim_host                          # gpt2-small's 75 tensors, CPU
    python -m bench.optim_host --only mars-adamw lion --rounds 5 --steps 100 --out results-dir

What a GPU step costs the CPU that launches it: the Python of the optimizer's step and of the
trainer's global gradient clip. Each step is the trainer's (``clip_grad_norm_``, or the clip
folded into the engine's norm pass where the optimizer can), with a new lr every step, on GPT-2
small's 75 tensors in two groups (matrices with weight decay, the rest without):

- the engine's variants (``implementation="triton"``) run with every kernel launch stubbed out
  (``optim.engine.loader.Go`` counts the launch and returns; Newton-Schulz returns an
  uncomputed result in its layout):
  what is timed is the host's work only. The tensors are the model's full shapes, or with
  ``--engine-cap N`` each dimension capped at N (the host's work does not depend on the sizes);
- torch's AdamW (``fused=True`` and ``foreach=True``) with ``clip_grad_norm_`` cannot have its
  device work stubbed (its kernels are C++ calls), so it runs on the shapes capped at ``--cap``
  (default 8: 75 tensors of at most 64 elements), where the CPU's kernels cost next to nothing:
  its host time plus a small remainder, a bound from above.

Triton's own launch overhead (binding a kernel's arguments, its cache lookup) is not in the
engine's figure: it needs a GPU (a kernel launched by Triton's interpreter runs numpy).

Prints the device line, per variant the median host ms per step over the rounds (min-max) and
the launches per step, and writes the raw record (``bench/record.py``) under ``--out``.
"""

from __future__ import annotations

import argparse
import time
from contextlib import contextmanager

import torch

import optim
from bench import record
from bench.harness import device_line, model_config
from model import build_model


def shapes(model: str) -> list[tuple[int, ...]]:
    """The model's parameter shapes (built on the meta device: nothing allocated)."""
    with torch.device("meta"):
        return [tuple(p.shape) for p in build_model(model_config(model)).parameters()]


def tensors(shape_list: list[tuple[int, ...]], cap: int | None) -> list[torch.nn.Parameter]:
    """A parameter with a gradient per shape (each dimension capped at ``cap``)."""
    out = []
    for s in shape_list:
        s = tuple(min(d, cap) for d in s) if cap else s
        p = torch.nn.Parameter(torch.full(s, 0.01))
        p.grad = torch.full(s, 1e-3)
        out.append(p)
    return out


def groups(params: list, **decay) -> list[dict]:
    """The registry's two groups: matrices with weight decay, the rest without."""
    return [{"params": [p for p in params if p.ndim >= 2], **decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]  # fmt: skip


def build(name: str, params: list):
    """The optimizer ``name`` over ``params`` (its engine variant unless torch's)."""
    if name == "torch-adamw-fused":
        return torch.optim.AdamW(groups(params, weight_decay=0.1), lr=6e-4, fused=True)
    if name == "torch-adamw-foreach":
        return torch.optim.AdamW(groups(params, weight_decay=0.1), lr=6e-4, foreach=True)
    if name in ("mars-adamw", "mars-adamw-unkept"):
        opt = optim.MARS(groups(params, weight_decay=0.1), lr=6e-3, implementation="triton")
        opt.engine_state.keep = name == "mars-adamw"  # unkept: every step built anew (before)
        return opt
    if name == "lion":
        return optim.Lion(groups(params, weight_decay=0.3), lr=2e-4, implementation="triton")
    if name == "muon":
        mats = [p for p in params if p.ndim == 2 and max(p.shape) < 10000]
        rest = [p for p in params if all(p is not m for m in mats)]
        return optim.Muon(mats, adamw_params=rest, implementation="triton")
    raise SystemExit(f"--only {name!r}: use one of {', '.join(NAMES)}")


NAMES = (
    "torch-adamw-fused",
    "torch-adamw-foreach",
    "mars-adamw",
    "mars-adamw-unkept",
    "lion",
    "muon",
)


@contextmanager
def stubbed(counter: list[int]):
    """Every engine kernel launch (and Newton-Schulz on its stacks) stubbed out; launches
    counted into ``counter[0]``."""
    from optim.engine import loader
    from optim.engine import ns as ns_pass

    call, newton_schulz = loader.Go.__call__, ns_pass.newton_schulz

    def go(self, kernel, grid, *args, **kw) -> None:
        counter[0] += 0 if self.dry else 1

    def no_ns(x, *a, **kw):  # an uncomputed result in the layout NS leaves (a tall one: X^T)
        return (
            x.new_empty((*x.shape[:-2], x.shape[-1], x.shape[-2])).mT
            if x.size(-2) > x.size(-1)
            else x
        )

    loader.Go.__call__, ns_pass.newton_schulz = go, no_ns
    try:
        yield
    finally:
        loader.Go.__call__, ns_pass.newton_schulz = call, newton_schulz


def one_step(opt, params: list, step: int, clip: float) -> None:
    """The trainer's step: a new lr, the global clip (folded where it can), the optimizer."""
    for group in opt.param_groups:
        group["lr"] = 1e-3 * (1 + 0.01 * (step % 7))
    fold = getattr(opt, "fold_grad_clip", None)
    if fold is None or fold(clip, params) is None:
        torch.nn.utils.clip_grad_norm_(params, clip)
    opt.step()


def setup(name: str, args) -> tuple:
    """``name``'s optimizer on its own tensors, after ``--warmup`` steps (state, compiles)."""
    cap = args.cap if name.startswith("torch-") else args.engine_cap
    params = tensors(shapes(args.model), cap)
    opt = build(name, params)
    for s in range(args.warmup):
        one_step(opt, params, s, args.clip)
    return opt, params


def measure(names: list[str], args) -> tuple[dict, dict]:
    """Host ms per step of each variant in each round (the variants take turns in every
    round, so a busy machine slows them alike), and launches per step."""
    counter, rounds, launches = [0], {n: [] for n in names}, {n: 0 for n in names}
    with stubbed(counter):
        runs = {n: setup(n, args) for n in names}
        for r in range(args.rounds):
            for name, (opt, params) in runs.items():
                counter[0] = 0
                t0 = time.perf_counter()
                for s in range(args.steps):
                    one_step(opt, params, args.warmup + r * args.steps + s, args.clip)
                rounds[name].append((time.perf_counter() - t0) / args.steps * 1e3)
                launches[name] = counter[0] / args.steps
    return rounds, launches


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    line = device_line("cpu")
    print(line)
    print(f"model: {args.model}, {len(shapes(args.model))} tensors; host ms per step (median "
          f"of {args.rounds} rounds of {args.steps} steps, min-max); engine launches stubbed")  # fmt: skip
    rounds, launches = measure(args.only, args)
    for name in args.only:
        s = record.spread(rounds[name])
        what = "torch" if name.startswith("torch-") else f"{launches[name]:.0f} engine launches"
        print(f"  {name:22s} {s['median']:7.3f} ms  ({s['min']:.3f}-{s['max']:.3f})  {what}")
    extra = {"launches_per_step": launches, "cap": args.cap, "engine_cap": args.engine_cap,
             "model": args.model, "steps_per_round": args.steps}  # fmt: skip
    if args.out:
        print("record:", record.write(args.out, device=line, rounds=rounds, unit="ms", extra=extra))


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="gpt2-small", help="a configs/model/*.yaml preset")
    ap.add_argument("--only", nargs="+", default=["torch-adamw-fused", "mars-adamw"],
                    choices=NAMES)  # fmt: skip
    ap.add_argument("--cap", type=int, default=8, help="torch's tensors: each dimension capped")
    ap.add_argument("--engine-cap", type=int, default=None, help="the engine's too (default: full)")
    ap.add_argument("--clip", type=float, default=1.0, help="the trainer's global clip")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (at least 3)")
    ap.add_argument("--steps", type=int, default=50, help="timed steps per round")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="directory (or .json file) of the raw record")
    args = ap.parse_args()
    if args.rounds < 3:
        raise SystemExit(f"--rounds {args.rounds}: at least 3 (the record keeps min/median/max)")
    return args


if __name__ == "__main__":
    main()
