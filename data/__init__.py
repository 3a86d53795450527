"""Text to token shards, shards to per-rank batches, and the offline GPT-2 tokenizer.

Modules: ``prepare`` (the command line and summary), ``catalog`` (the named sources and the
validation splits), ``sources`` (reading local files, the hub and the embedded corpus),
``pipeline`` (parallel tokenization and resumable shard writing), ``rawbin`` (nanoGPT's
``train.bin``/``val.bin`` as input), ``shards`` (the file format), ``windows`` and ``loader``
(batches), ``tokenizer``, ``config``.

The loader and prepare names are imported lazily (PEP 562 ``__getattr__``): tokenizer-only users
and ``python -m data.prepare`` do not pay for importing torch, and ``python -m data.prepare`` does
not import ``data.prepare`` twice (once as ``__main__``), which runpy warns about.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from data.config import DataConfig, shard_files
from data.shards import ShardError, find_shards, load_shard, read_header, write_shard
from data.tokenizer import EOT, VOCAB_SIZE, decode, encode, get_tokenizer

if TYPE_CHECKING:
    from data.loader import TokenLoader, num_val_windows, val_batches
    from data.prepare import ensure_prepared, prepare_sotu

_LAZY = {
    "TokenLoader": "data.loader",
    "val_batches": "data.loader",
    "num_val_windows": "data.loader",
    "ensure_prepared": "data.prepare",
    "prepare_sotu": "data.prepare",
}

__all__ = [
    "EOT",
    "VOCAB_SIZE",
    "DataConfig",
    "ShardError",
    "TokenLoader",
    "decode",
    "encode",
    "ensure_prepared",
    "find_shards",
    "get_tokenizer",
    "load_shard",
    "num_val_windows",
    "prepare_sotu",
    "read_header",
    "shard_files",
    "val_batches",
    "write_shard",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'data' has no attribute {name!r}")
