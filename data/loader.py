"""Deterministic, checkpointable (x, y) batches from token shards, split across ranks.

Windowing: with sequence length T, shard s of length L_s holds n_s = (L_s - 1) // T windows;
window j is ``tokens[j*T : j*T + T + 1]`` (x is its first T tokens, y its last T). Windows never
cross shard boundaries. Global window ids 0..N-1 run over the shards in sorted file order.

Training order: epoch e visits every window once, in the order
``np.random.default_rng([seed, e]).permutation(N)``. Global sample k is window ``perm_{k//N}[k%N]``.
A counter ``consumed`` (windows taken by all ranks together) is the whole data position: in one
micro-step rank r takes samples ``[consumed + r*B, consumed + (r+1)*B)`` and every rank then adds
``world_size*B``. So ranks are disjoint, and one process taking two micro-batches of B gets
exactly what two ranks get in one micro-step; the position survives changes of batch size or
world size.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from data.shards import load_shard, read_header

log = logging.getLogger(__name__)

Batch = tuple[torch.Tensor, torch.Tensor]


def _sorted_files(files: Sequence[str | Path]) -> list[Path]:
    if isinstance(files, (str, Path)):
        raise ValueError(f"files must be a list of shard paths, got the single path {files!r}")
    paths = sorted({Path(f) for f in files}, key=str)
    if not paths:
        raise ValueError("no shard files given; pass the output of data.find_shards(...)")
    return paths


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _window_counts(lengths: Sequence[int], seq_len: int) -> np.ndarray:
    return np.array([max(0, (n - 1) // seq_len) for n in lengths], dtype=np.int64)


def _no_windows_error(files: Sequence[Path], lengths: Sequence[int], seq_len: int) -> ValueError:
    return ValueError(
        f"the {len(files)} shard(s) (longest {max(lengths)} tokens, first {files[0]}) hold no "
        f"window of seq_len+1 = {seq_len + 1} tokens; use a smaller seq_len or more data"
    )


class _Windows:
    """Memory-mapped shards and the map from global window id to its T+1 tokens."""

    def __init__(self, files: Sequence[Path], seq_len: int) -> None:
        self.files = list(files)
        self.seq_len = seq_len
        self.shards = [load_shard(f) for f in self.files]
        lengths = [len(s) for s in self.shards]
        counts = _window_counts(lengths, seq_len)
        self.starts = np.concatenate([[0], np.cumsum(counts)])  # starts[s] = first id of shard s
        self.num_windows = int(self.starts[-1])
        if self.num_windows == 0:
            raise _no_windows_error(self.files, lengths, seq_len)

    def gather(self, ids: np.ndarray) -> np.ndarray:
        """Return the windows ``ids`` as an int64 array of shape (len(ids), T + 1)."""
        T = self.seq_len
        out = np.empty((len(ids), T + 1), dtype=np.int64)
        shard_idx = np.searchsorted(self.starts, ids, side="right") - 1
        for row, (w, s) in enumerate(zip(ids.tolist(), shard_idx.tolist())):
            start = (w - int(self.starts[s])) * T
            out[row] = self.shards[s][start : start + T + 1]
        return out


def _to_device(windows: np.ndarray, device: torch.device) -> Batch:
    """Split windows of T+1 tokens into (x, y) int64 tensors on ``device``."""
    x = torch.from_numpy(np.ascontiguousarray(windows[:, :-1]))
    y = torch.from_numpy(np.ascontiguousarray(windows[:, 1:]))
    if device.type == "cuda":
        # Pinned host memory lets the copy overlap with compute on the GPU.
        return (
            x.pin_memory().to(device, non_blocking=True),
            y.pin_memory().to(device, non_blocking=True),
        )
    return x.to(device), y.to(device)


class TokenLoader:
    """Training batches: every window once per epoch, seeded order, disjoint across ranks."""

    def __init__(
        self,
        files: Sequence[str | Path],
        *,
        batch_size: int,
        seq_len: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ) -> None:
        _check_positive(batch_size=batch_size, seq_len=seq_len, world_size=world_size)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must lie in [0, world_size={world_size}), got {rank}")
        self.files = _sorted_files(files)
        self.batch_size = int(batch_size)
        self.seq_len = int(seq_len)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.seed = int(seed)
        self.device = torch.device(device)
        self._windows = _Windows(self.files, self.seq_len)
        self._consumed = 0
        self._perms: dict[int, np.ndarray] = {}
        log.debug(
            "TokenLoader: %d windows of %d tokens in %d shard(s)",
            self.num_windows,
            self.seq_len,
            len(self.files),
        )

    @property
    def num_windows(self) -> int:
        """Number of windows N in one epoch."""
        return self._windows.num_windows

    @property
    def tokens_per_epoch(self) -> int:
        """Number of input tokens (N * T) in one epoch."""
        return self.num_windows * self.seq_len

    @property
    def consumed(self) -> int:
        """Windows taken so far by all ranks together (the same on every rank)."""
        return self._consumed

    @property
    def epoch(self) -> int:
        """The epoch of the next sample (consumed // N)."""
        return self._consumed // self.num_windows

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) >= 2:  # a batch straddles at most a few epochs; keep it small
                self._perms.pop(min(self._perms))
            self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(
                self.num_windows
            )
        return self._perms[epoch]

    def _window_ids(self, first: int, count: int) -> np.ndarray:
        """Window ids of global samples ``first, ..., first + count - 1`` (may cross epochs)."""
        n = self.num_windows
        ids = np.empty(count, dtype=np.int64)
        done = 0
        while done < count:
            epoch, pos = divmod(first + done, n)
            take = min(count - done, n - pos)
            ids[done : done + take] = self._permutation(epoch)[pos : pos + take]
            done += take
        return ids

    def _batch_at(self, consumed: int) -> Batch:
        first = consumed + self.rank * self.batch_size
        windows = self._windows.gather(self._window_ids(first, self.batch_size))
        return _to_device(windows, self.device)

    def next_batch(self) -> Batch:
        """Return this rank's next (x, y), each int64 of shape (batch_size, seq_len), and advance."""
        batch = self._batch_at(self._consumed)
        self._consumed += self.world_size * self.batch_size
        return batch

    def peek_batch(self, ahead: int = 0) -> Batch:
        """Return the batch the ``ahead``-th next call of next_batch will return; do not advance."""
        if ahead < 0:
            raise ValueError(f"ahead must be >= 0, got {ahead}")
        return self._batch_at(self._consumed + ahead * self.world_size * self.batch_size)

    def state_dict(self) -> dict:
        """The data position as plain ints (the same on every rank)."""
        return {
            "consumed": self._consumed,
            "seed": self.seed,
            "num_windows": self.num_windows,
            "seq_len": self.seq_len,
            "batch_size": self.batch_size,
            "world_size": self.world_size,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from a saved position; batch size and world size may differ from the save."""
        for key in ("seq_len", "seed", "num_windows"):  # seq_len first: it changes num_windows
            saved, ours = int(state[key]), getattr(self, key)
            if saved != ours:
                raise ValueError(
                    f"cannot resume the data order: the checkpoint has {key}={saved} but this "
                    f"loader has {key}={ours}; a different data set, sequence length or seed "
                    "does not continue the same order (use the original ones, or start afresh)"
                )
        consumed = int(state["consumed"])
        if consumed < 0:
            raise ValueError(f"consumed must be >= 0, got {consumed}")
        self._consumed = consumed


def num_val_windows(
    files: Sequence[str | Path], *, seq_len: int, max_tokens: int | None = None
) -> int:
    """Number of validation windows Nv: all windows, or at most max_tokens // seq_len."""
    _check_positive(seq_len=seq_len)
    paths = _sorted_files(files)
    lengths = [read_header(p) for p in paths]
    total = int(_window_counts(lengths, seq_len).sum())
    if total == 0:
        raise _no_windows_error(paths, lengths, seq_len)
    if max_tokens is None:
        return total
    if max_tokens < seq_len:
        raise ValueError(
            f"max_tokens={max_tokens} is less than one sequence of seq_len={seq_len}; "
            "raise max_tokens or pass None for the whole validation set"
        )
    return min(total, max_tokens // seq_len)


def val_batches(
    files: Sequence[str | Path],
    *,
    batch_size: int,
    seq_len: int,
    rank: int = 0,
    world_size: int = 1,
    max_tokens: int | None = None,
    device: str | torch.device = "cpu",
) -> Iterator[Batch]:
    """Yield this rank's batches of the fixed validation set, in order, without shuffling.

    The set is the first Nv windows in file order (see ``num_val_windows``); window i belongs
    to rank ``i % world_size``. The last batch may be smaller than batch_size, and ranks may get
    different numbers of batches (by at most one window each), so reduce sums, not per-batch means.
    """
    # Not a generator itself, so bad arguments raise here rather than at the first next().
    _check_positive(batch_size=batch_size, world_size=world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must lie in [0, world_size={world_size}), got {rank}")
    n_val = num_val_windows(files, seq_len=seq_len, max_tokens=max_tokens)
    windows = _Windows(_sorted_files(files), seq_len)
    ids = np.arange(rank, n_val, world_size, dtype=np.int64)
    return _iter_batches(windows, ids, batch_size, torch.device(device))


def _iter_batches(
    windows: _Windows, ids: np.ndarray, batch_size: int, device: torch.device
) -> Iterator[Batch]:
    for start in range(0, len(ids), batch_size):
        yield _to_device(windows.gather(ids[start : start + batch_size]), device)
