"""Deterministic, checkpointable (x, y) batches from token shards, split across ranks.

Windows of T + 1 tokens (x is the first T, y the last T) come from memory-mapped shards and
never cross shard boundaries (``data/windows.py``). Global window ids 0..N-1 number the
non-overlapping windows over the shards in sorted file order.

Sampling, a pure function of the global sample index k (so ``peek_batch`` reads ahead without
side effects and a restored position continues identically):

- ``shuffle`` (default): without replacement. Epoch e visits every window once, in the order
  ``np.random.default_rng([seed, e]).permutation(N)``; sample k is window ``perm_{k//N}[k%N]``.
- ``random``: the official MARS/nanoGPT loaders' random windows, with replacement. Sample k
  starts at a position drawn uniformly from every start position of every shard (token-weighted;
  the official FineWeb-Edu loader first picks a shard uniformly, which is the same when the
  shards are the same size); the draws come in blocks of 4,096 from
  ``np.random.default_rng([seed, RANDOM_STREAM, k // 4096])``.

A counter ``consumed`` (samples taken by all ranks together) is the whole data position: in one
micro-step rank r takes samples ``[consumed + r*B, consumed + (r+1)*B)`` and every rank then adds
``world_size*B``. So ranks are disjoint, and one process taking two micro-batches of B gets
exactly what two ranks get in one micro-step; the position survives changes of batch size or
world size.

Prefetch: since a batch depends only on its position, a background thread reads the next
``prefetch`` batches (the windows gathered from the shards and, for a GPU, pinned) while the
current step computes; the main thread then only starts the host-to-device copy, asynchronously
from pinned memory. The batches are the same bit for bit, and the position (``state_dict``) is
still ``consumed``: batches read ahead and not yet taken are simply read again after a restore.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from data.config import SAMPLING
from data.shards import read_header
from data.tokenizer import VOCAB_SIZE
from data.windows import DEFAULT_MAX_OPEN, ShardWindows, no_windows_error, window_counts

log = logging.getLogger(__name__)

Batch = tuple[torch.Tensor, torch.Tensor]
RANDOM_STREAM = 0x52414E44  # separates the random-window draws from the epoch permutations
RANDOM_BLOCK = 4096
SUBSET_SEED = 0x53554253  # the fixed subset of windows ``fraction`` < 1 keeps (every run's)


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


def _host(windows: np.ndarray, device: torch.device) -> torch.Tensor:
    """Windows as a host tensor ready for ``device``: pinned for a GPU (the slow part of the
    copy, done off the critical path when prefetched)."""
    w = torch.from_numpy(windows)
    return w.pin_memory() if device.type == "cuda" else w


def _split(w: torch.Tensor, device: torch.device) -> Batch:
    """Host windows of T+1 tokens as (x, y) int64 tensors on ``device``."""
    if device.type == "cuda":
        # One copy from pinned host memory, which can overlap with compute on the GPU.
        w = w.to(device, non_blocking=True)
    elif device.type != "cpu":
        w = w.to(device)
    return w[:, :-1].contiguous(), w[:, 1:].contiguous()


def _to_device(windows: np.ndarray, device: torch.device) -> Batch:
    """Split windows of T+1 tokens into (x, y) int64 tensors on ``device``."""
    return _split(_host(windows, device), device)


class TokenLoader:
    """Training batches in a seeded order, disjoint across ranks; see the module docstring.

    ``sampling`` is "shuffle" (every window once per epoch) or "random" (random windows with
    replacement, as the official code); ``vocab_size`` bounds every token read (None: no check);
    ``max_open_shards`` bounds the memory maps (file descriptors) held at once; ``prefetch``
    batches are read ahead by a background thread (0: none; the batches are the same)."""

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
        sampling: str = "shuffle",
        vocab_size: int | None = VOCAB_SIZE,
        max_open_shards: int = DEFAULT_MAX_OPEN,
        prefetch: int = 2,
        fraction: float = 1.0,
    ) -> None:
        _check_positive(batch_size=batch_size, seq_len=seq_len, world_size=world_size)
        if not isinstance(prefetch, (int, np.integer)) or prefetch < 0:
            raise ValueError(
                f"prefetch must be an integer >= 0 (0: no read-ahead), got {prefetch!r}"
            )
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must lie in [0, world_size={world_size}), got {rank}")
        if sampling not in SAMPLING:
            raise ValueError(f"unknown sampling {sampling!r}; valid: {', '.join(SAMPLING)}")
        self.sampling = sampling
        self.files = _sorted_files(files)
        self.batch_size = int(batch_size)
        self.seq_len = int(seq_len)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.seed = int(seed)
        self.device = torch.device(device)
        self._windows = ShardWindows(
            self.files, self.seq_len, vocab_size=vocab_size, max_open=max_open_shards
        )
        # fraction < 1: the epochs run over a fixed subset of the windows, the same for every
        # seed (sorted window ids); None: every window
        self._subset: np.ndarray | None = None
        if fraction != 1.0:
            if not 0 < fraction < 1 or sampling != "shuffle":
                raise ValueError(f"fraction {fraction!r}: in (0, 1], with shuffle sampling")
            total = self._windows.num_windows
            keep = max(1, int(total * fraction))
            pick = np.random.default_rng(SUBSET_SEED).permutation(total)[:keep]
            self._subset = np.sort(pick)
        self._consumed = 0
        self._perms: dict[int, np.ndarray] = {}  # shuffle: epoch -> permutation
        self._blocks: dict[int, np.ndarray] = {}  # random: block -> start positions
        self.prefetch = int(prefetch)
        self._lock = threading.Lock()  # the caches above and the shard maps: one reader at a time
        self._ahead: dict[int, Future] = {}  # position (consumed) -> host windows being read
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="prefetch") if prefetch else None
        self._read_ahead()  # the first step's batches too
        log.debug(
            "TokenLoader: %d windows of %d tokens in %d shard(s), %s sampling",
            self.num_windows,
            self.seq_len,
            len(self.files),
            self.sampling,
        )

    @property
    def num_windows(self) -> int:
        """Number of windows N in one epoch (the subset's, with ``fraction`` < 1)."""
        return self._windows.num_windows if self._subset is None else len(self._subset)

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
        return ids if self._subset is None else self._subset[ids]

    def _random_block(self, block: int) -> np.ndarray:
        if block not in self._blocks:
            if len(self._blocks) >= 2:
                self._blocks.pop(min(self._blocks))
            rng = np.random.default_rng([self.seed, RANDOM_STREAM, block])
            self._blocks[block] = rng.integers(0, self._windows.num_positions, RANDOM_BLOCK)
        return self._blocks[block]

    def _random_positions(self, first: int, count: int) -> np.ndarray:
        """Start positions of global samples ``first, ..., first + count - 1``."""
        samples = np.arange(first, first + count)
        out = np.empty(count, dtype=np.int64)
        for block in np.unique(samples // RANDOM_BLOCK).tolist():
            mine = samples // RANDOM_BLOCK == block
            out[mine] = self._random_block(block)[samples[mine] % RANDOM_BLOCK]
        return out

    def _host_batch(self, consumed: int) -> torch.Tensor:
        """This rank's windows at position ``consumed``, on the host (a pure function of it)."""
        first = consumed + self.rank * self.batch_size
        with self._lock:
            if self.sampling == "random":
                positions = self._random_positions(first, self.batch_size)
                windows = self._windows.gather_positions(positions)
            else:
                windows = self._windows.gather(self._window_ids(first, self.batch_size))
        return _host(windows, self.device)

    def _batch_at(self, consumed: int) -> Batch:
        ahead = self._ahead.get(consumed)
        host = ahead.result() if ahead is not None else self._host_batch(consumed)
        return _split(host, self.device)

    def _read_ahead(self) -> None:
        """Keep the next ``prefetch`` batches being read; forget those already passed."""
        if self._reader is None:
            return
        stride = self.world_size * self.batch_size
        wanted = [self._consumed + i * stride for i in range(self.prefetch)]
        for position in [p for p in self._ahead if p not in wanted]:
            del self._ahead[position]
        for position in wanted:
            if position not in self._ahead:
                self._ahead[position] = self._reader.submit(self._host_batch, position)

    def next_batch(self) -> Batch:
        """Return this rank's next (x, y), each int64 of shape (batch_size, seq_len), and advance."""
        batch = self._batch_at(self._consumed)
        self._consumed += self.world_size * self.batch_size
        self._read_ahead()
        return batch

    def close(self) -> None:
        """Stop the read-ahead thread (the loader still works, without read-ahead)."""
        if self._reader is not None:
            self._reader.shutdown(wait=True, cancel_futures=True)
            self._reader, self._ahead = None, {}

    def peek_batch(self, ahead: int = 0) -> Batch:
        """Return the batch the ``ahead``-th next call of next_batch will return; do not advance."""
        if ahead < 0:
            raise ValueError(f"ahead must be >= 0, got {ahead}")
        return self._batch_at(self._consumed + ahead * self.world_size * self.batch_size)

    def state_dict(self) -> dict:
        """The data position as plain ints and strings (the same on every rank)."""
        return {
            "consumed": self._consumed,
            "sampling": self.sampling,
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
        saved = state.get("sampling", "shuffle")  # checkpoints from before sampling modes
        if saved != self.sampling:
            raise ValueError(
                f"cannot resume the data order: the checkpoint has sampling={saved!r} but this "
                f"loader has sampling={self.sampling!r}; set data.sampling={saved} to continue"
            )
        consumed = int(state["consumed"])
        if consumed < 0:
            raise ValueError(f"consumed must be >= 0, got {consumed}")
        self._consumed = consumed
        self._ahead = {}  # read ahead from the old position: read again from the new one
        self._read_ahead()


def num_val_windows(
    files: Sequence[str | Path], *, seq_len: int, max_tokens: int | None = None
) -> int:
    """Number of validation windows Nv: all windows, or at most max_tokens // seq_len."""
    _check_positive(seq_len=seq_len)
    paths = _sorted_files(files)
    lengths = [read_header(p) for p in paths]
    total = int(window_counts(lengths, seq_len).sum())
    if total == 0:
        raise no_windows_error(paths, lengths, seq_len)
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
    vocab_size: int | None = VOCAB_SIZE,
    pad: bool = True,
) -> Iterator[Batch]:
    """Yield this rank's batches of the fixed validation set, in order, without shuffling.

    The set is the first Nv windows in file order (see ``num_val_windows``); window i belongs
    to rank ``i % world_size``. With ``pad`` (the default) every batch has ``batch_size`` rows
    and every rank yields the same number of batches, ``ceil(ceil(Nv / world_size) /
    batch_size)``: rows past a rank's last window are padding (input token 0, every target -1,
    which the loss ignores). So a compiled model sees one shape (no recompilation, no dynamic
    graph) and every rank runs the same number of forward passes. Without ``pad`` the last
    batch may be short and ranks may differ by a batch. Either way, reduce sums over the real
    targets (``y != -1``), not per-batch means. A fixed ``max_tokens`` makes validation
    losses comparable across runs and world sizes.
    """
    # Not a generator itself, so bad arguments raise here rather than at the first next().
    _check_positive(batch_size=batch_size, world_size=world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must lie in [0, world_size={world_size}), got {rank}")
    n_val = num_val_windows(files, seq_len=seq_len, max_tokens=max_tokens)
    windows = ShardWindows(_sorted_files(files), seq_len, vocab_size=vocab_size)
    ids = np.arange(rank, n_val, world_size, dtype=np.int64)
    most = -(-n_val // world_size)  # the windows of rank 0, which has the most
    batches = -(-most // batch_size) if pad else -(-len(ids) // batch_size)
    return _iter_batches(windows, ids, batch_size, batches, torch.device(device), pad)


def _iter_batches(
    windows: ShardWindows, ids: np.ndarray, batch_size: int, batches: int,
    device: torch.device, pad: bool,
) -> Iterator[Batch]:  # fmt: skip
    for start in range(0, batches * batch_size, batch_size):
        mine = ids[start : start + batch_size]
        real = windows.gather(mine) if len(mine) else np.zeros((0, windows.seq_len + 1), np.int64)
        if not pad or len(mine) == batch_size:
            yield _to_device(real, device)
            continue
        full = np.zeros((batch_size, real.shape[1]), dtype=real.dtype)
        full[: len(mine)] = real
        x, y = _to_device(full, device)
        y[len(mine) :] = -1  # padding rows: no target
        yield x, y


class RandomBatches:
    """Stands in for ``TokenLoader`` where the data must not cost time (the benchmarks, the
    study's proxy speed): the same ``n`` random batches of ``batch_size`` windows of
    ``seq_len`` tokens below ``vocab_size``, in turn, on ``device``."""

    def __init__(self, batch_size: int, seq_len: int, vocab_size: int, *, n: int = 2,
                 device: str | torch.device = "cpu") -> None:  # fmt: skip
        _check_positive(batch_size=batch_size, seq_len=seq_len, n=n)
        g = torch.Generator().manual_seed(0)
        shape = (batch_size, seq_len + 1)
        tokens = [torch.randint(0, vocab_size, shape, generator=g) for _ in range(n)]
        self.batches = [
            (t[:, :-1].contiguous().to(device), t[:, 1:].contiguous().to(device)) for t in tokens
        ]
        self.i = 0

    def next_batch(self) -> Batch:
        self.i += 1
        return self.batches[self.i % len(self.batches)]

    def peek_batch(self, k: int = 0) -> Batch:
        return self.batches[(self.i + 1 + k) % len(self.batches)]
