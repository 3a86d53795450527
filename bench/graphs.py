"""How many graphs torch.compile cuts the DDP-wrapped model into (DDPOptimizer), per bucket cap.

    python -m bench.graphs                                  # gpt2-small, torch's 25 MB and ours
    python -m bench.graphs --model gpt2-xl --bucket-cap-mb 25 100 200

Under DDP, torch.compile splits the model's graph at DDP's gradient-bucket boundaries so that
each bucket's all-reduce can start while the rest of the backward runs (DDPOptimizer). With
torch's default 25 MB buckets a GPT-2 block's gradients span several buckets and the model falls
into many small graphs. This wraps the model (built on the CPU, one gloo rank: the split depends on
the bucket sizes, not on the device or the world size) in DDP, compiles it with a counting backend
(``eager`` by default: the count is dynamo's and needs no compiler) and runs one forward/backward;
it prints the pieces for each cap, ``trainer.trainer.ddp_bucket_cap_mb`` (a block per bucket at
least) among them.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from bench.harness import device_line, model_config, reset_compiled
from model import GPT, GPTConfig
from trainer.trainer import ddp_bucket_cap_mb


def _ensure_process_group() -> bool:
    """A one-rank gloo group for DDP; True when this call created it (and must destroy it)."""
    if dist.is_initialized():
        return False
    store = tempfile.mktemp(prefix="bench-graphs-")  # noqa: S306 (a rendezvous file name)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    return True


def count_ddp_pieces(cfg: GPTConfig, bucket_cap_mb: float, *, seq_len: int = 64) -> int:
    """Graphs the compiled, DDP-wrapped model (one gloo rank) is cut into at ``bucket_cap_mb``."""
    created = _ensure_process_group()
    try:
        return _count_pieces(cfg, bucket_cap_mb, seq_len)
    finally:
        if created:  # leave no process group behind (a caller's later code expects none)
            dist.destroy_process_group()


def _count_pieces(cfg: GPTConfig, bucket_cap_mb: float, seq_len: int) -> int:
    reset_compiled()
    torch.manual_seed(0)
    model = GPT(cfg)
    ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)
    pieces = 0

    def counting_backend(gm: torch.fx.GraphModule, example_inputs):  # noqa: ANN001, ANN202
        nonlocal pieces
        pieces += 1
        return gm.forward

    compiled = torch.compile(ddp, backend=counting_backend)
    x = torch.randint(0, cfg.vocab_size, (1, min(seq_len, cfg.block_size)))
    _, loss = compiled(x, x)
    loss.backward()
    reset_compiled()
    return pieces


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="gpt2-small", help="a configs/model/*.yaml preset")
    ap.add_argument("--bucket-cap-mb", type=float, nargs="+", default=None,
                    help="default: torch's 25 and ddp_bucket_cap_mb(model)")  # fmt: skip
    args = ap.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    cfg = model_config(args.model)
    with torch.device("meta"):
        ours = ddp_bucket_cap_mb(GPT(cfg))
    caps = args.bucket_cap_mb or [25.0, ours]
    print(device_line("cpu"))
    print(f"model {args.model}: {cfg.n_layer} blocks; ddp_bucket_cap_mb(model) = {ours:g}")
    for cap in caps:
        print(f"  bucket_cap_mb {cap:g}: {count_ddp_pieces(cfg, cap)} compiled graph pieces")


if __name__ == "__main__":
    main()
