"""Optimizer state per parameter (measured) and peak training memory per model and optimizer
(trainer.memory_model, part by part), and the micro-batch the launcher picks for a GPU.

    python -m bench.memory                        # GPT-2 small..XL, every optimizer, paper batch
    python -m bench.memory --parts --models gpt2-xl --optimizers mars-adamw --micro-batch 5
    python -m bench.memory --pick 80              # the largest micro-batch that fits 80 GB
    python -m bench.memory --largest 78 --optimizers adamw mars-adamw muon  # per GPU count, DDP/FSDP
    python -m bench.memory --models tiny gpt2-small --micro-batch 1 --seq-len 256 --ddp

State bytes per parameter are measured, not estimated (trainer/memory_plan.py: each optimizer
takes one step on the model built on the meta device, shapes only, and its state tensors are
summed, each tensor once); tests/test_memory.py checks this equals the state of a real step. The
rest of the peak is trainer/memory_model.py's model; its activation term is checked against the
bytes autograd saves (``saved_activation_bytes``, saved-tensor hooks on the CPU) and
bench/train.py prints the real peak (torch.cuda.max_memory_allocated) beside the estimate on a
GPU.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

import optim
from bench.harness import GPU_MODELS, model_config, optimizer_variants, paper_micro_batch
from model import GPTConfig
from trainer.config import TrainConfig
from trainer.memory_model import GIB, describe, estimate_memory, largest_table
from trainer.memory_plan import meta_state_bytes

PER_RANK = 60  # 480 sequences per step over 8 GPUs: the launcher's default candidates


def saved_activation_bytes(fn: Callable[[], object], params) -> int:
    """Bytes of the distinct storages autograd saves while ``fn`` runs, parameters excluded.

    Autocast's bf16 weight copies are saved too; difference two token counts to drop them.
    """
    skip = {p.untyped_storage().data_ptr() for p in params}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in skip:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def print_parts(name: str, mb: int, label: str, opt_cfg, args) -> None:
    cfg = model_config(name)
    state, _ = meta_state_bytes(cfg, opt_cfg)
    est = estimate_memory(cfg, state_bytes=state, micro_batch=mb, **estimate_kwargs(args))
    print(f"{name}, micro-batch {mb}, {label}:\n{describe(est)}")


def estimate_kwargs(args) -> dict:
    return dict(seq_len=args.seq_len, loss_chunk_tokens=args.loss_chunk_tokens,
                activation_checkpointing=args.activation_checkpointing, ddp=args.ddp,
                gradient_as_bucket_view=args.bucket_view)  # fmt: skip


def print_table(args, opts) -> None:
    print(f"{'model':<12}{'micro-batch':>12} {'optimizer':<20}{'state B/param':>14}"
          f"{'state GiB':>10}{'allocated':>10}{'total':>8}{'plain loss':>11}")  # fmt: skip
    for name in args.models:
        cfg = model_config(name)
        mb = args.micro_batch or paper_micro_batch(name)
        for label, opt_cfg in opts:
            state, n = meta_state_bytes(cfg, opt_cfg)
            kw = {**estimate_kwargs(args), "state_bytes": state, "micro_batch": mb}
            est = estimate_memory(cfg, **kw)
            plain = estimate_memory(cfg, **{**kw, "loss_chunk_tokens": 0})
            print(f"{name:<12}{mb:>12} {label:<20}{state / n:>14.2f}{state / GIB:>10.2f}"
                  f"{est.allocated / GIB:>10.1f}{est.total / GIB:>8.1f}"
                  f"{plain.total / GIB:>11.1f}")  # fmt: skip


def _estimator(cfg: GPTConfig, kw: dict) -> Callable[[int], object]:
    """micro-batch -> trainer.memory_model.MemoryEstimate."""
    return lambda b: estimate_memory(cfg, micro_batch=b, **kw)


def print_picks(args, opts, memory_gib: float) -> None:
    """The largest divisor of PER_RANK sequences that fits, per model (worst optimizer listed)."""
    from trainer.memory_model import fitting_micro_batch

    cands = [d for d in range(1, PER_RANK + 1) if PER_RANK % d == 0]
    print(f"the largest micro-batch dividing {PER_RANK} that fits {memory_gib:g} GiB (total)")
    for name in args.models:
        cfg = model_config(name)
        worst = max((meta_state_bytes(cfg, o)[0], label) for label, o in opts)
        kw = {**estimate_kwargs(args), "state_bytes": worst[0]}

        est = _estimator(cfg, kw)
        b = fitting_micro_batch(cands, memory_gib, est)
        got = f"{b} ({est(b).total / GIB:.1f} GiB)" if b else "none fits"
        print(f"  {name:<12} {worst[1]:<20} micro-batch {got}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(GPU_MODELS))
    ap.add_argument("--optimizers", nargs="+", default=None, help="default: all registered")
    ap.add_argument("--micro-batch", type=int, default=None, help="default: the papers'")
    ap.add_argument("--seq-len", type=int, default=None, help="default: block_size")
    ap.add_argument("--loss-chunk-tokens", type=int, default=TrainConfig.loss_chunk_tokens)
    ap.add_argument("--activation-checkpointing", action="store_true")
    ap.add_argument("--ddp", action="store_true", help="several ranks: count DDP's buckets")
    ap.add_argument("--bucket-view", action=argparse.BooleanOptionalAction, default=True,
                    help="DDP gradient_as_bucket_view (default: on)")  # fmt: skip
    ap.add_argument("--parts", action="store_true", help="print every part of each estimate")
    ap.add_argument("--pick", type=float, metavar="GIB", help="the micro-batch that fits GIB")
    ap.add_argument("--largest", type=float, metavar="GIB",
                    help="per GPU count, the largest model that fits GIB, DDP and FSDP")  # fmt: skip
    args = ap.parse_args()
    if args.largest:
        opts = dict(optimizer_variants(args.optimizers or ["adamw", "mars-adamw"], exact=False))
        print(f"the largest model whose one-rank ESTIMATE fits {args.largest:g} GiB "
              "(trainer/memory_model.py: largest_table), papers' micro-batch:")  # fmt: skip
        print(largest_table(opts, state_bytes=lambda c, o: meta_state_bytes(c, o)[0],
                            memory_gib=args.largest))  # fmt: skip
        return
    opts = optimizer_variants(args.optimizers or optim.available(), exact=True)
    print(f"loss_chunk_tokens {args.loss_chunk_tokens} (plain loss: 0), activation checkpointing "
          f"{args.activation_checkpointing}, DDP {args.ddp} (bucket view {args.bucket_view}); "
          "memory: ESTIMATES (trainer/memory_model.py), GiB")  # fmt: skip
    if args.pick:
        print_picks(args, opts, args.pick)
    elif args.parts:
        for name in args.models:
            for label, opt_cfg in opts:
                mb = args.micro_batch or paper_micro_batch(name)
                print_parts(name, mb, label, opt_cfg, args)
    else:
        print_table(args, opts)


if __name__ == "__main__":
    main()
