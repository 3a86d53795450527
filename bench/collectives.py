"""The Newton-Schulz collectives and FLOPs a step on each rank, from the assignment (no GPU, no
process group): what a multi-GPU run of the Muon family will send, before it runs.

    python -m bench.collectives                                   # gpt2-small, 8 and 64 ranks
    python -m bench.collectives --model gpt2-xl --world 8 --embeddings --out DIR

For the model's matrices (the block matrices, the default routing; ``--embeddings`` adds the
tied embedding and the positions, the MARS repo's Muon routing): each rank's Newton-Schulz FLOPs
(max and mean: the split's balance, and the lower bound a lone largest matrix sets), DDP's
collectives a step (per batch: per shape, or per shape up to transposition where the iteration
is fused, as on CUDA and on the engine's stacks: an all-gather of the slots every rank fills,
a broadcast from its owner of each matrix beyond them, optim/newton_schulz.py ``layout``) with
the bytes the rank that receives most receives against the results' bytes, beside the padded
all-gather this replaced (``padded``: every batch W x k slots), the buffers each rank holds for
them (``ns_buffer_bytes``: the engine's stack, gathered results and own slots), and FSDP2's
all-to-alls (two per shape, unpadded) with the bytes and the engine's buffers for them
(``ns_shard_buffer_bytes``). In the Newton-Schulz dtype (``--itemsize``, bf16:
2). Prints the device line and writes the raw record (bench/record.py) with ``--out``.
tests/test_bench_collectives.py and tests/test_ns_traffic.py assert the figures.
"""

from __future__ import annotations

import argparse

from bench import record
from bench.harness import device_line
from bench.newton_schulz import adamw_shapes, block_shapes, model_spec
from optim.newton_schulz import ns_buffer_bytes, rank_flops, received_bytes, split_traffic
from optim.sharded import all_to_all_traffic, ns_flops, ns_shard_buffer_bytes


def matrices(model: str, embeddings: bool) -> list[tuple[int, int]]:
    """The model's Newton-Schulz matrices (with ``embeddings``: the MARS repo's Muon routing)."""
    spec = model_spec(model)
    blocks = block_shapes(spec, spec["n_layer"])
    return (adamw_shapes(spec)[:2] if embeddings else []) + blocks


def figures(shapes: list[tuple[int, int]], world: int, itemsize: int) -> dict:
    """One world size's figures (module docstring)."""
    flops = rank_flops(shapes, world)
    bound = max(max(ns_flops(s) for s in shapes), sum(flops) / world)
    out = {"ns_gflop_max": max(flops) / 1e9, "ns_gflop_mean": sum(flops) / world / 1e9,
           "ns_gflop_bound": bound / 1e9}  # fmt: skip
    for merged in (False, True):
        batches = split_traffic(shapes, world, merged=merged, itemsize=itemsize)
        out[f"ddp_{'merged' if merged else 'per_shape'}"] = {
            "all_gathers": sum(1 for b in batches if b["k"]),
            "broadcasts": sum(b["broadcasts"] for b in batches),
            "sent_mb": sum(b["sent"] for b in batches) / 1e6,
            "received_mb": received_bytes(shapes, world, merged=merged, itemsize=itemsize) / 1e6,
            "results_mb": sum(b["results"] for b in batches) / 1e6,
            "padded_received_mb": sum(b["padded_received"] for b in batches) / 1e6,
            "buffer_mb": ns_buffer_bytes(shapes, world, merged=merged, itemsize=itemsize) / 1e6,
            "padded_buffer_mb": ns_buffer_bytes(shapes, world, merged=merged, itemsize=itemsize,
                                                padded=True) / 1e6}  # fmt: skip
    a2a = all_to_all_traffic(shapes, world, itemsize)
    out["fsdp"] = {"all_to_alls": sum(b["count"] for b in a2a),
                   "there_mb": sum(b["there"] for b in a2a) / 1e6,
                   "back_mb_most": sum(b["back"] for b in a2a) / 1e6,
                   "buffer_mb": ns_shard_buffer_bytes(shapes, world, itemsize) / 1e6}  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="gpt2-small", help="a configs/model/*.yaml preset")
    ap.add_argument("--world", type=int, nargs="+", default=[8, 16, 32])
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
        merged, fsdp = f["ddp_merged"], f["fsdp"]
        print(f"  {world:4d} ranks: NS {f['ns_gflop_max']:.0f} GFLOP max, "
              f"{f['ns_gflop_mean']:.0f} mean, {f['ns_gflop_bound']:.0f} bound | DDP merged "
              f"{merged['all_gathers']} all-gathers + {merged['broadcasts']} broadcasts, "
              f"{merged['received_mb']:.0f} MB received at most for {merged['results_mb']:.0f} "
              f"MB of results (padded: {merged['padded_received_mb']:.0f}), buffers "
              f"{merged['buffer_mb']:.0f} MB (padded {merged['padded_buffer_mb']:.0f}) | FSDP "
              f"{fsdp['all_to_alls']} all-to-alls, {fsdp['there_mb']:.1f} MB there, "
              f"{fsdp['back_mb_most']:.1f} MB back at most, buffers {fsdp['buffer_mb']:.0f} MB")  # fmt: skip
    if args.out:
        extra = {"model": args.model, "embeddings": args.embeddings, "itemsize": args.itemsize,
                 "per_world": per_world}  # fmt: skip
        print("record:", record.write(args.out, device=line, rounds={}, unit="count",
                                      extra=extra))  # fmt: skip


if __name__ == "__main__":
    main()
