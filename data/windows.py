"""Windows of T + 1 tokens read from memory-mapped shards, addressed two ways.

- Window ids (the loader's default ``shuffle`` sampling and validation): with sequence length T,
  shard s of L_s tokens holds n_s = (L_s - 1) // T non-overlapping windows; window j of shard s
  is ``tokens[j*T : j*T + T + 1]``; ids 0..N-1 run over the shards in sorted file order.
- Start positions (``random`` sampling): every position p with p + T + 1 <= L_s, over all
  shards, numbered 0..P-1 in file order.

Windows never cross shard boundaries. Only shard headers are read up front; shards are
memory-mapped when first used, and at most ``max_open`` maps are kept (least recently used
closed first; by default a quarter of the open-file limit, 256 under the common limit of 1,024),
because each map holds a file descriptor and FineWeb-Edu-100B has 1,000 shards per rank.
Every window read is checked against the vocabulary, so a shard made with another tokenizer
fails with its name instead of an index error deep in the model.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from data.shards import ShardError, load_shard, read_header


def _default_max_open() -> int:
    """A quarter of the soft limit on open files (at least 16): room for everything else."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 128
    return 128 if soft == resource.RLIM_INFINITY else max(16, soft // 4)


DEFAULT_MAX_OPEN = _default_max_open()


def window_counts(lengths: Sequence[int], seq_len: int) -> np.ndarray:
    """Non-overlapping windows of seq_len + 1 tokens per shard."""
    return np.array([max(0, (n - 1) // seq_len) for n in lengths], dtype=np.int64)


def no_windows_error(files: Sequence[Path], lengths: Sequence[int], seq_len: int) -> ValueError:
    return ValueError(
        f"the {len(files)} shard(s) (longest {max(lengths)} tokens, first {files[0]}) hold no "
        f"window of seq_len+1 = {seq_len + 1} tokens; use a smaller seq_len or more data"
    )


class ShardWindows:
    """The windows of seq_len + 1 tokens in ``files`` (sorted by the caller)."""

    def __init__(
        self,
        files: Sequence[Path],
        seq_len: int,
        *,
        vocab_size: int | None = None,
        max_open: int = DEFAULT_MAX_OPEN,
    ) -> None:
        self.files = list(files)
        self.seq_len = seq_len
        self.vocab_size = vocab_size
        self.max_open = max(1, max_open)
        self.lengths = np.array([read_header(f) for f in self.files], dtype=np.int64)
        counts = window_counts(self.lengths.tolist(), seq_len)
        self.window_starts = np.concatenate([[0], np.cumsum(counts)])  # first id of each shard
        self.num_windows = int(self.window_starts[-1])
        if self.num_windows == 0:
            raise no_windows_error(self.files, self.lengths.tolist(), seq_len)
        positions = np.maximum(self.lengths - seq_len, 0)
        self.position_starts = np.concatenate([[0], np.cumsum(positions)])
        self.num_positions = int(self.position_starts[-1])
        self._open: OrderedDict[int, np.ndarray] = OrderedDict()

    def _shard(self, s: int) -> np.ndarray:
        tokens = self._open.get(s)
        if tokens is None:
            tokens = load_shard(self.files[s])
            self._open[s] = tokens
            if len(self._open) > self.max_open:
                self._open.popitem(last=False)
        else:
            self._open.move_to_end(s)
        return tokens

    def _read(self, shards: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        n = self.seq_len + 1
        out = np.empty((len(shards), n), dtype=np.int64)
        cols = np.arange(n)
        # one fancy index per shard, not one slice per row: a 2,048-window batch took 85 ms of
        # Python a step (the loop), which bounded a GPU's step at large batches
        offsets = np.asarray(offsets)
        one = len(shards) and shards.min() == shards.max()  # the usual case: one shard
        for s in [int(shards[0])] if one else np.unique(shards).tolist():
            tokens = np.asarray(self._shard(s))  # a plain view: no memmap per index
            if one:
                out[:] = tokens[offsets[:, None] + cols]
            else:
                rows = np.flatnonzero(shards == s)
                out[rows] = tokens[offsets[rows][:, None] + cols]
        if self.vocab_size is not None and out.size and int(out.max()) >= self.vocab_size:
            row = int(np.flatnonzero((out >= self.vocab_size).any(axis=1))[0])
            col = int(np.flatnonzero(out[row] >= self.vocab_size)[0])
            raise ShardError(
                f"{self.files[int(shards[row])]} holds token {int(out[row, col])} at position "
                f"{int(offsets[row]) + col}, outside the vocabulary of {self.vocab_size}; it was "
                "made with another tokenizer or is corrupt: re-create it (python -m data.prepare)"
            )
        return out

    def gather(self, ids: np.ndarray) -> np.ndarray:
        """Windows with ids ``ids``, as int64 of shape (len(ids), seq_len + 1)."""
        shards = np.searchsorted(self.window_starts, ids, side="right") - 1
        return self._read(shards, (ids - self.window_starts[shards]) * self.seq_len)

    def gather_positions(self, positions: np.ndarray) -> np.ndarray:
        """Windows starting at global start positions ``positions`` (0 <= p < num_positions)."""
        shards = np.searchsorted(self.position_starts, positions, side="right") - 1
        return self._read(shards, positions - self.position_starts[shards])
