"""Pointer tables, built once per set of tensors and kept while those tensors live.

A ``Plan`` is what one kernel launch over a bucket's tensors needs on the device: ``table``, a
row of addresses and sizes per tensor (optim/engine/layout.py), and ``blocks``, one
``(tensor, block)`` pair per program; with a norm pass, its scratch (``partial``: one sum per
block; ``divisors``: one clip factor per tensor). Plans are cached per optimizer by the tensors'
addresses and sizes, so a step whose tensors are the ones of an earlier step (the parameters and
state always; the gradients whenever the allocator hands back the same blocks, which it does in
a steady loop, and always under DDP's gradient buckets) copies nothing to the device. A new set
(a state loaded from a checkpoint, exact mode's swapped reference buffer) builds one more plan:
one small asynchronous copy from pinned memory, no host synchronisation.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch

from optim.engine import layout as L

Tensors = list[torch.Tensor]
CACHE_SIZE = 32  # plans kept per optimizer (a few per bucket: exact mode alternates two)


def key(cols: dict[int, Tensors], block: int, extra: tuple = ()) -> tuple:
    """What a plan depends on: the block size, each column's addresses, the sizes."""
    first = next(iter(cols.values()))
    return (block, extra, tuple(t.numel() for t in first),
            tuple((c, tuple(_address(t) for t in ts)) for c, ts in sorted(cols.items())))  # fmt: skip


def _address(t: torch.Tensor | None) -> int:
    """A tensor's address in a table row; 0 for None (a row without that tensor: the clip
    fold's rows without a reference gradient, optim/engine/clip.py)."""
    return 0 if t is None else t.data_ptr()


def to_device(host: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``host`` on ``device`` without a host synchronisation (CUDA: pinned, asynchronous); the
    host tensor is returned too, kept alive while the copy may still be running."""
    if device.type != "cuda":
        return host, host
    pinned = host.pin_memory()
    return pinned.to(device, non_blocking=True), pinned


class Plan:
    """The tables of one launch over ``cols`` (column -> one tensor per row, row order);
    ``tcols``: each row's ``C_TCOLS`` (Newton-Schulz's transposed slices, optim/engine/ns.py),
    ``strided`` where any is set."""

    def __init__(self, cols: dict[int, Tensors], block: int, *, norm: bool = False,
                 tcols: list[int] | None = None) -> None:  # fmt: skip
        first = next(iter(cols.values()))
        device, dtype = first[0].device, first[0].dtype
        numels = [t.numel() for t in first]
        counts = [-(-n // block) for n in numels]
        if tcols:  # a transposed Newton-Schulz slice: tiles (a norm pass reads none past numel)
            counts = [
                L.tiles(n // c, c, block) if c else k for n, c, k in zip(numels, tcols, counts)
            ]
        self.n, self.nblocks, self.block = len(numels), sum(counts), block
        # every address 16-byte aligned: the kernels may say so (vectorised loads and stores)
        self.aligned = all(_address(t) % 16 == 0 for ts in cols.values() for t in ts)
        rows = torch.zeros((self.n, L.NCOLS), dtype=torch.int64)
        for c, ts in cols.items():  # (None: address 0, a row without that tensor)
            rows[:, c] = torch.tensor([_address(t) for t in ts], dtype=torch.int64)
        rows[:, L.C_NUMEL] = torch.tensor(numels, dtype=torch.int64)
        count = torch.tensor(counts, dtype=torch.int64)
        firsts = torch.cumsum(count, 0) - count
        rows[:, L.C_FIRST], rows[:, L.C_NBLK] = firsts, count
        # a tall matrix's columns where its Newton-Schulz slice is its transpose (0: not)
        self.strided = bool(tcols) and any(tcols)
        if self.strided:
            rows[:, L.C_TCOLS] = torch.tensor(tcols, dtype=torch.int64)
        which = torch.repeat_interleave(torch.arange(self.n), count)
        within = torch.arange(self.nblocks) - firsts[which]
        blocks = torch.stack([which, within], dim=1).to(torch.int32).contiguous()
        self.table, self._host_table = to_device(rows, device)
        self.blocks, self._host_blocks = to_device(blocks, device)
        self.partial = self.divisors = None
        if norm:
            self.partial = torch.empty(max(self.nblocks, 1), dtype=dtype, device=device)
            self.divisors = torch.empty(max(self.n, 1), dtype=dtype, device=device)


class PlanCache:
    """The plans of one optimizer, least recently used dropped first."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self.size, self.plans = size, OrderedDict()
        self.built = 0  # plans built so far (a test reads it: steady steps build none)

    def get(self, k: tuple, build: Callable[[], Plan]) -> Plan:
        plan = self.plans.get(k)
        if plan is None:
            plan = self.plans[k] = build()
            self.built += 1
            while len(self.plans) > self.size:
                self.plans.popitem(last=False)
        else:
            self.plans.move_to_end(k)
        return plan
