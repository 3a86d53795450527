"""How many graphs the Trainer's compiled DDP layout runs as: the model compiled region by region
(``compile_regions``: the embeddings, one block for all, the final norm, the head with its loss),
then wrapped in DDP, exactly as ``Trainer.wrap`` does.

    python -m bench.graphs                          # gpt2-small: the Trainer's layout
    python -m bench.graphs --model gpt2-xl --ddp-optimizer   # and with Dynamo's DDPOptimizer on

Built on the CPU on one gloo rank (the split depends on the bucket sizes, not on the device or
the world size), compiled with a counting backend (dynamo's graphs, no compiler needed), one
forward/backward. Prints the graphs compiled, the graph breaks and whether attention (SDPA) is
inside the block's graph. The Trainer turns Dynamo's DDPOptimizer off (``regions_under_ddp``):
each block is already its own graph and DDP's reducer overlaps each bucket's all-reduce with the
backward through its own hooks; with it on, DDP's small first bucket cuts a block into pieces
(``--ddp-optimizer`` shows how many).
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from bench.harness import device_line, model_config, reset_compiled
from model import GPT, GPTConfig
from trainer.trainer import GRADIENT_AS_BUCKET_VIEW, ddp_bucket_cap_mb, no_buffer_sync


def _ensure_process_group() -> bool:
    """A one-rank gloo group for DDP; True when this call created it (and must destroy it)."""
    if dist.is_initialized():
        return False
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    store = tempfile.mktemp(prefix="bench-graphs-")  # noqa: S306 (a rendezvous file name)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    return True


def count_trainer_graphs(cfg: GPTConfig, *, ddp_optimizer: bool = False, seq_len: int = 64,
                         bucket_cap_mb: float | None = None) -> dict:  # fmt: skip
    """{graphs, breaks, sdpa_in_graph} of ``cfg`` compiled as the Trainer compiles it, under DDP
    (one gloo rank, the Trainer's bucket cap unless given); ``ddp_optimizer``: Dynamo's
    DDPOptimizer on (the Trainer runs it off)."""
    created = _ensure_process_group()
    try:
        with torch._dynamo.config.patch(optimize_ddp=ddp_optimizer):
            return _count(cfg, seq_len, bucket_cap_mb)
    finally:
        if created:  # leave no process group behind (a caller's later code expects none)
            dist.destroy_process_group()


def _count(cfg: GPTConfig, seq_len: int, bucket_cap_mb: float | None) -> dict:
    from torch._dynamo.utils import counters

    reset_compiled()
    counters.clear()
    torch.manual_seed(0)
    model = GPT(cfg)
    graphs: list[list] = []

    def counting_backend(gm: torch.fx.GraphModule, example_inputs):  # noqa: ANN001, ANN202
        graphs.append([n.target for n in gm.graph.nodes if n.op == "call_function"])
        return gm.forward

    model.compile_regions(backend=counting_backend, dynamic=False)
    cap = bucket_cap_mb if bucket_cap_mb is not None else ddp_bucket_cap_mb(model)
    ddp = DDP(model, bucket_cap_mb=cap, gradient_as_bucket_view=GRADIENT_AS_BUCKET_VIEW,
              **no_buffer_sync())  # fmt: skip
    x = torch.randint(0, cfg.vocab_size, (1, min(seq_len, cfg.block_size)))
    _, loss = ddp(x, x)
    loss.backward()
    out = {
        "graphs": len(graphs),
        "breaks": int(sum(counters["graph_break"].values())),
        "sdpa_in_graph": any(F.scaled_dot_product_attention in g for g in graphs),
    }
    reset_compiled()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="gpt2-small", help="a configs/model/*.yaml preset")
    ap.add_argument(
        "--ddp-optimizer",
        action="store_true",
        help="also count with Dynamo's DDPOptimizer on (the Trainer turns it off)",
    )
    args = ap.parse_args()
    cfg = model_config(args.model)
    with torch.device("meta"):
        cap = ddp_bucket_cap_mb(GPT(cfg))
    print(device_line("cpu"))
    print(f"model {args.model}: {cfg.n_layer} blocks; DDP bucket cap {cap:g} MB; regions: "
          "embeddings, block (one for all), final norm, head")  # fmt: skip
    for on in (False, True) if args.ddp_optimizer else (False,):
        n = count_trainer_graphs(cfg, ddp_optimizer=on)
        label = "DDPOptimizer on " if on else "the Trainer's   "
        print(f"  {label}: {n['graphs']} graphs, {n['breaks']} graph breaks, attention "
              f"{'inside' if n['sdpa_in_graph'] else 'outside'} the block's graph")  # fmt: skip


if __name__ == "__main__":
    main()
