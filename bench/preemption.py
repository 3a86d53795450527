"""Per-step cost of the preemption check (trainer/preemption.py, ``stop_requested``).

    torchrun --standalone --nproc_per_node=2 -m bench.preemption [--steps 200 --rounds 6]

Each rank runs a stand-in DDP step (host matmuls, then a 1 MB gradient all-reduce, as DDP ends a
step), with and without the check, interleaved round by round in one process; rank 0 prints the
median step time of each and the overhead, with the device. CPU and gloo only (the check itself
always runs on a gloo group, also in a NCCL run).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
import torch.distributed as dist

from trainer.preemption import PreemptionGuard


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=200, help="steps per round and case")
    ap.add_argument("--rounds", type=int, default=6, help="interleaved rounds")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    guard = PreemptionGuard()
    x, grads = torch.randn(256, 256), torch.zeros(250_000)

    def step() -> None:
        for _ in range(3):
            x @ x
        dist.all_reduce(grads)

    times: dict[str, list[float]] = {"plain": [], "check": []}
    for _ in range(args.rounds):
        for case in times:
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step()
                if case == "check":
                    guard.stop_requested()
            times[case].append((time.perf_counter() - t0) / args.steps)
    with guard:  # finishes the all-reduce in flight
        pass
    if dist.get_rank() == 0:
        plain, check = (statistics.median(times[c]) * 1e3 for c in ("plain", "check"))
        print(f"device: cpu ({platform.processor() or platform.machine()}), "
              f"{dist.get_world_size()} gloo processes, torch {torch.__version__}, "
              f"{torch.get_num_threads()} threads each")  # fmt: skip
        print(f"median step over {args.rounds} rounds x {args.steps} steps: plain {plain:.3f} ms, "
              f"with the check {check:.3f} ms, overhead {check - plain:+.3f} ms "
              f"({check / plain:.3f}x)")  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
