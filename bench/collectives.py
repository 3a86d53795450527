"""The Newton-Schulz collectives and FLOPs a step on each rank, from the assignment (no GPU, no
process group): what a multi-GPU run of the Muon family will send, before it runs.

    python -m bench.collectives                                   # gpt2-small, 8 and 64 ranks
    python -m bench.collectives --model gpt2-xl --world 8 --embeddings --out DIR

For the model's matrices (the block matrices, the default routing; ``--embeddings`` adds the
tied embedding and the positions, the MARS repo's Muon routing): each rank's Newton-Schulz FLOPs
(max and mean: the split's balance), DDP's all-gathers a step (one per batch: per shape, or
per shape up to transposition where the iteration is fused, as on CUDA and on the engine's
stacks) with the bytes each rank sends and receives, and FSDP2's all-to-alls (two per shape)
with the bytes. In the Newton-Schulz dtype (``--itemsize``, bf16: 2). Prints the device line
and writes the raw record (bench/record.py) with ``--out``. tests/test_bench_collectives.py
asserts GPT-2 small's figures.
"""

from __future__ import annotations

import argparse

from bench import record
from bench.harness import device_line
from bench.newton_schulz import adamw_shapes, block_shapes, model_spec
from optim.newton_schulz import rank_flops, split_traffic
from optim.sharded import all_to_all_traffic


def matrices(model: str, embeddings: bool) -> list[tuple[int, int]]:
    """The model's Newton-Schulz matrices (with ``embeddings``: the MARS repo's Muon routing)."""
    spec = model_spec(model)
    blocks = block_shapes(spec, spec["n_layer"])
    return (adamw_shapes(spec)[:2] if embeddings else []) + blocks


def figures(shapes: list[tuple[int, int]], world: int, itemsize: int) -> dict:
    """One world size's figures (module docstring)."""
    flops = rank_flops(shapes, world)
    out = {"ns_gflop_max": max(flops) / 1e9, "ns_gflop_mean": sum(flops) / world / 1e9}
    for merged in (False, True):
        gathers = split_traffic(shapes, world, merged=merged, itemsize=itemsize)
        out[f"ddp_{'merged' if merged else 'per_shape'}"] = {
            "all_gathers": len(gathers), "sent_mb": sum(g["sent"] for g in gathers) / 1e6,
            "received_mb": sum(g["received"] for g in gathers) / 1e6}  # fmt: skip
    a2a = all_to_all_traffic(shapes, world, itemsize)
    out["fsdp"] = {"all_to_alls": sum(b["count"] for b in a2a),
                   "there_mb": sum(b["there"] for b in a2a) / 1e6,
                   "back_mb_most": sum(b["back"] for b in a2a) / 1e6}  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="gpt2-small", help="a configs/model/*.yaml preset")
    ap.add_argument("--world", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--embeddings", action="store_true", help="the MARS repo's Muon routing")
    ap.add_argument("--itemsize", type=int, default=2, help="bytes per element (bf16: 2)")
    ap.add_argument("--out", default=None, help="directory (or .json file) of the raw record")
    args = ap.parse_args()
    line, shapes = device_line("cpu"), matrices(args.model, args.embeddings)
    print(line)
    print(f"model: {args.model}, {len(shapes)} Newton-Schulz matrices; a step, per rank")
    per_world = {}
    for world in args.world:
        f = per_world[str(world)] = figures(shapes, world, args.itemsize)
        ddp, merged, fsdp = f["ddp_per_shape"], f["ddp_merged"], f["fsdp"]
        print(f"  {world:4d} ranks: NS {f['ns_gflop_max']:.0f} GFLOP max, "
              f"{f['ns_gflop_mean']:.0f} mean | DDP {ddp['all_gathers']} all-gathers "
              f"({merged['all_gathers']} merged), {ddp['received_mb']:.0f} MB received "
              f"({merged['received_mb']:.0f}) | FSDP {fsdp['all_to_alls']} all-to-alls, "
              f"{fsdp['there_mb']:.1f} MB there, {fsdp['back_mb_most']:.1f} MB back at most")  # fmt: skip
    if args.out:
        extra = {"model": args.model, "embeddings": args.embeddings, "itemsize": args.itemsize,
                 "per_world": per_world}  # fmt: skip
        print("record:", record.write(args.out, device=line, rounds={}, unit="count",
                                      extra=extra))  # fmt: skip


if __name__ == "__main__":
    main()
