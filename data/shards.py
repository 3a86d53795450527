"""Read and write token shards in the llm.c / modded-nanogpt format.

A shard is a header of 256 little-endian int32 (``[magic, version, num_tokens, tokenizer, 0,
...]``, 1024 bytes) followed by ``num_tokens`` little-endian uint16 token ids. Word 3 names the
tokenizer (``data/vocabs.py``: 0 GPT-2, the llm.c default, 1 bytes). This is the format
the official FineWeb-Edu loaders read, so shards made elsewhere work here and ours work there.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike

from runtime.files import atomic_open

log = logging.getLogger(__name__)

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
TOKEN_DTYPE = np.dtype("<u2")


class ShardError(ValueError):
    """A file that is not a valid token shard (truncated, foreign, wrong version, bad tokens)."""


def write_shard(path: str | Path, tokens: ArrayLike, *, tokenizer_id: int = 0) -> None:
    """Write ``tokens`` (ints in [0, 65536)) as a shard at ``path``, atomically.

    The data goes to a temporary file in the same directory, is fsynced, then renamed over
    ``path``, so a crash never leaves a half-written shard under the final name.
    """
    path = Path(path)
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        arr = arr.reshape(-1)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"shard tokens must be integers, got dtype {arr.dtype}; pass token ids")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= 65536):
        raise ValueError(
            f"shard tokens must lie in [0, 65536) to fit uint16, got min {int(arr.min())} and "
            f"max {int(arr.max())}; use a tokenizer whose vocabulary has at most 65536 entries"
        )
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:4] = (MAGIC, VERSION, arr.size, tokenizer_id)
    with atomic_open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(arr.astype(TOKEN_DTYPE, copy=False).tobytes())
    log.debug("wrote %s (%d tokens)", path, arr.size)


def read_header(path: str | Path) -> int:
    """Validate the shard header and file size at ``path``; return its number of tokens."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"token shard {path} does not exist; check the path or prepare it")
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(HEADER_BYTES)
    if len(raw) < HEADER_BYTES:
        raise ShardError(
            f"{path} is not a token shard: it has {size} bytes, fewer than the "
            f"{HEADER_BYTES}-byte header; re-create it with python -m data.prepare ..."
        )
    magic, version, num_tokens = (int(v) for v in np.frombuffer(raw, dtype="<i4", count=3))
    if magic != MAGIC:
        raise ShardError(
            f"{path} is not a token shard (magic {magic} != {MAGIC}); "
            "re-create it with python -m data.prepare ..."
        )
    if version != VERSION:
        raise ShardError(
            f"{path} has unsupported shard version {version} (supported: {VERSION}); "
            "re-create it with python -m data.prepare ..."
        )
    expected = HEADER_BYTES + TOKEN_DTYPE.itemsize * num_tokens
    if num_tokens < 0 or size != expected:
        raise ShardError(
            f"{path} is truncated or corrupt: expected {num_tokens} tokens ({expected} bytes) "
            f"but file has {size} bytes; re-create it with python -m data.prepare ..."
        )
    return num_tokens


def read_tokenizer_id(path: str | Path) -> int:
    """Header word 3 of the shard at ``path``: the id of the tokenizer that made it."""
    read_header(path)
    with open(path, "rb") as f:
        return int(np.frombuffer(f.read(16), dtype="<i4")[3])


def load_shard(
    path: str | Path, *, mmap: bool = True, validate_vocab: int | None = None
) -> np.ndarray:
    """Return the tokens of the shard at ``path`` as a 1-D uint16 array.

    With ``mmap`` (default) the array is a read-only ``np.memmap`` (nothing is read until it is
    used); otherwise the tokens are read into memory. With ``validate_vocab=V`` every token is
    checked to be < V (this reads the whole shard) and a ShardError names the first bad one.
    """
    path = Path(path)
    num_tokens = read_header(path)
    if mmap and num_tokens > 0:
        tokens = np.memmap(
            path, dtype=TOKEN_DTYPE, mode="r", offset=HEADER_BYTES, shape=(num_tokens,)
        )
    else:
        with open(path, "rb") as f:
            f.seek(HEADER_BYTES)
            tokens = np.fromfile(f, dtype=TOKEN_DTYPE, count=num_tokens)
    if validate_vocab is not None and num_tokens > 0:
        bad = np.flatnonzero(tokens >= validate_vocab)
        if bad.size:
            raise ShardError(
                f"{path} holds tokens outside the vocabulary of {validate_vocab}: token "
                f"{int(tokens[bad[0]])} at position {int(bad[0])} ({bad.size} bad in all); "
                "it was made with another tokenizer: re-create it with python -m data.prepare ..."
            )
    return tokens


def find_shards(directory: str | Path, pattern: str) -> list[Path]:
    """Return the files in ``directory`` matching the glob ``pattern``, sorted by name."""
    directory = Path(directory)
    files = sorted(p for p in directory.glob(pattern) if p.is_file())
    if not files:
        raise FileNotFoundError(
            f"no token shards matching {pattern!r} in {directory}; prepare them with "
            f"python -m data.prepare SOURCE --out {directory}"
        )
    return files
