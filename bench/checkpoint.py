"""How long a checkpoint blocks the training loop: the single file, DCP, and asynchronous DCP.

    python -m bench.checkpoint                                  # gpt2-small, MARS-AdamW
    python -m bench.checkpoint --model gpt2-medium --saves 3 --dir /scratch/bench
    torchrun --nproc_per_node=2 -m bench.checkpoint --device cpu   # DCP splits the writing

Builds the model and optimizer, takes one optimizer step so its state exists, then saves the
same state ``--saves`` times in each format, interleaved (file, dcp, dcp-async, file, ...), as
the training loop does (``trainer.checkpoint.save_training_state``): ``stall`` is how long the save
call blocked (for dcp-async: the copy to CPU memory), ``written`` how long until the checkpoint
was on disk and committed. Prints the device line and the medians.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

import optim
from bench.data import device_line
from bench.harness import model_config
from model import build_model
from runtime.distributed import barrier, destroy, init_distributed
from trainer import checkpoint as ckpt
from trainer.dcp_checkpoint import DcpCheckpointer, split_tensors

ROOT = Path(__file__).resolve().parent.parent
FORMATS = ("file", "dcp", "dcp-async")


def build(model_name: str, optimizer: str, device: torch.device):
    model = build_model(model_config(model_name))
    model.to(device)
    cls = optim.get_spec(optimizer).config_cls
    opt = optim.build_optimizer(model, cls(implementation="foreach"))  # the state: no compile
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    if getattr(opt, "needs_reference_grad", False):
        opt.store_reference_grad()
    opt.step()  # the optimizer state now exists, as after any training step
    return model, opt


def state_bytes(states: dict) -> int:
    tensors: dict[str, torch.Tensor] = {}
    split_tensors(states, "", tensors)
    return sum(t.numel() * t.element_size() for t in tensors.values())


def save_once(fmt: str, run_dir: Path, step: int, model, opt, savers: dict, is_main: bool):
    """(stall, written) seconds of one save in format ``fmt``."""
    states = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    side = {"format_version": ckpt.FORMAT_VERSION, "step": step, "loader": {}, "rng": [],
            "config": {}, "tokens": 0}  # fmt: skip
    barrier()
    t0 = time.perf_counter()
    if fmt == "file":
        if is_main:
            ckpt.save_checkpoint(run_dir, step, {**states, **side}, keep=1)
        barrier()
    else:
        saver = savers[fmt]
        saver.save(ckpt.checkpoint_dir(run_dir), step, states, side,
                   lambda _: ckpt.prune_checkpoints(run_dir, 1))  # fmt: skip
    stall = time.perf_counter() - t0
    if fmt == "dcp-async":
        savers[fmt].wait()
    barrier()
    return stall, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="gpt2-small", help="a configs/model/*.yaml preset")
    ap.add_argument("--optimizer", default="mars-adamw")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--saves", type=int, default=3, help="saves per format")
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = ap.parse_args()
    dist = init_distributed(args.device)
    model, opt = build(args.model, args.optimizer, dist.device)
    nbytes = state_bytes({"model": model.state_dict(), "optimizer": opt.state_dict()})
    base = Path(args.dir or tempfile.gettempdir()) / "bench_checkpoint"
    savers = {
        "dcp": DcpCheckpointer(asynchronous=False, rank=dist.rank, world_size=dist.world_size),
        "dcp-async": DcpCheckpointer(asynchronous=True, rank=dist.rank, world_size=dist.world_size),
    }
    if dist.is_main:  # each format's row as soon as it is measured
        name = torch.cuda.get_device_name(dist.device) if dist.device.type == "cuda" else "CPU"
        print(f"device: {dist.device} ({name}); {device_line()}; {dist.world_size} process(es)")
        print(f"model {args.model} + {args.optimizer} state: {nbytes / 1e9:.2f} GB per checkpoint,"
              f" written under {base}")  # fmt: skip
        print(f"{'format':<12}{'stall s':>10}{'written s':>11}{'stall GB/s':>12}  (median of "
              f"{args.saves})", flush=True)  # fmt: skip
    for fmt in FORMATS:
        times = [save_once(fmt, base / fmt, i + 1, model, opt, savers, dist.is_main)
                 for i in range(args.saves)]  # fmt: skip
        if dist.is_main:
            stall = statistics.median(t[0] for t in times)
            written = statistics.median(t[1] for t in times)
            print(f"{fmt:<12}{stall:>10.2f}{written:>11.2f}{nbytes / 1e9 / stall:>12.2f}",
                  flush=True)  # fmt: skip
    if dist.is_main:
        shutil.rmtree(base, ignore_errors=True)
    destroy()


if __name__ == "__main__":
    main()
