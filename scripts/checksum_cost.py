"""What checkpoint checksums cost (trainer/checksums.py): SHA-256 throughput, and a small
model's checkpoint saved with and without its checksum, interleaved, several rounds.

    python -m scripts.checksum_cost                       # 256 MiB buffer, 5 rounds
    python -m scripts.checksum_cost --mib 512 --rounds 7 --model-mib 64

Prints the median and spread (min-max) of each figure and what GPT-2 small's 2.14 GB checkpoint
(MARS-AdamW state, docs/checkpoints.md) would take to hash at the measured rate: the time a
synchronous save (and a load, which checks it) spends hashing; an asynchronous DCP save hashes in
its writer thread, off the training step.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from runtime.runfiles import cpu_name
from trainer.checksums import file_digest, save_checksummed

GPT2_SMALL_CHECKPOINT_BYTES = 2.14e9


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def spread(values: list[float], unit: str = "s", scale: float = 1.0) -> str:
    v = [x * scale for x in values]
    return f"median {statistics.median(v):.3f} {unit} (min {min(v):.3f}, max {max(v):.3f})"


def hash_rates(buffer: bytes, rounds: int) -> dict[str, list[float]]:
    """MB/s of each algorithm over ``buffer``, the algorithms interleaved round by round."""
    rates: dict[str, list[float]] = {"sha256": [], "blake2b": []}
    for _ in range(rounds):
        for name in rates:
            seconds = timed(lambda n=name: hashlib.new(n, buffer).digest())
            rates[name].append(len(buffer) / seconds / 1e6)
    return rates


def save_costs(state: dict, directory: Path, rounds: int) -> dict[str, list[float]]:
    """Seconds to save ``state`` plainly, with its checksum (hashed as written), and to verify
    it by reading it back, interleaved round by round."""
    plain, checked = directory / "plain.pt", directory / "checked.pt"
    costs: dict[str, list[float]] = {"save": [], "save+checksum": [], "verify (read+hash)": []}
    for _ in range(rounds):
        costs["save"].append(timed(lambda: torch.save(state, plain)))
        costs["save+checksum"].append(timed(lambda: save_checksummed(state, checked)))
        costs["verify (read+hash)"].append(timed(lambda: file_digest(checked)))
    return costs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mib", type=int, default=256, help="buffer hashed per round (MiB)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--model-mib", type=int, default=64, help="the small checkpoint's size (MiB)")
    args = ap.parse_args(argv)
    if min(args.mib, args.rounds, args.model_mib) < 1:
        raise SystemExit("error: --mib, --rounds and --model-mib must be >= 1")
    print(
        f"device: {cpu_name()} ({os.cpu_count()} cores) | torch {torch.__version__} | rounds {args.rounds}"
    )
    buffer = torch.randint(0, 256, (args.mib << 20,), dtype=torch.uint8).numpy().tobytes()
    rates = hash_rates(buffer, args.rounds)
    for name, r in rates.items():
        print(f"{name} over {args.mib} MiB: {spread(r, 'MB/s')}")
    sha = rates["sha256"]
    gb = GPT2_SMALL_CHECKPOINT_BYTES
    print(f"GPT-2 small's {gb / 1e9:.2f} GB checkpoint: SHA-256 takes "
          f"{spread([gb / 1e6 / r for r in sha])} to hash")  # fmt: skip
    n = (args.model_mib << 20) // 4
    state = {"model": {"w": torch.randn(n // 3)}, "optimizer": {"m": torch.randn(n - n // 3)}}
    with tempfile.TemporaryDirectory() as d:
        for name, c in save_costs(state, Path(d), args.rounds).items():
            print(f"{args.model_mib} MiB checkpoint, {name}: {spread(c)}")


if __name__ == "__main__":
    main()
