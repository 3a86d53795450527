"""nanoGPT's token files as an input: a folder with ``train.bin`` and ``val.bin``, raw uint16
GPT-2 tokens with no header (what nanoGPT's and the official MARS code's OpenWebText
``prepare.py`` writes, with ``<|endoftext|>`` after each document). They are copied into shards
of our format, split at ``shard_tokens``; nothing is tokenized again. Shards already written
with the right length are kept, so an interrupted conversion resumes where it stopped.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from data.shards import MAGIC, read_header, write_shard
from data.tokenizer import EOT, VOCAB_SIZE

log = logging.getLogger("data.prepare")

SPLIT_FILES = {"train": "train.bin", "val": "val.bin"}


def is_nanogpt_folder(path: str | Path) -> bool:
    """True if ``path`` is a folder holding nanoGPT's headerless train.bin and val.bin."""
    path = Path(path)
    files = [path / name for name in SPLIT_FILES.values()]
    if not path.is_dir() or not all(f.is_file() for f in files):
        return False
    with open(files[0], "rb") as f:
        head = np.frombuffer(f.read(4).ljust(4, b"\0"), dtype="<i4")[0]
    return int(head) != MAGIC


def describe(path: str | Path) -> dict:
    path = Path(path)
    sizes = {s: (path / f).stat().st_size for s, f in SPLIT_FILES.items()}
    return {"path": str(path.resolve()), "nanogpt_bin_bytes": sizes}


def convert(path: str | Path, out_dir: Path, prefix: str, shard_tokens: int) -> dict:
    """Copy ``path``/train.bin and val.bin into ``{prefix}_{split}_{i:06d}.bin`` shards.

    Returns ``{split: [shard records]}`` like the tokenizing pipeline."""
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {}
    for split, name in SPLIT_FILES.items():
        src = Path(path) / name
        if src.stat().st_size % 2:
            raise ValueError(f"{src} has an odd number of bytes: it is not a uint16 token file")
        tokens = np.memmap(src, dtype="<u2", mode="r")
        records = []
        for i, start in enumerate(range(0, len(tokens), shard_tokens)):
            chunk = tokens[start : start + shard_tokens]
            target = out_dir / f"{prefix}_{split}_{i:06d}.bin"
            if not _already(target, len(chunk)):
                if int(chunk.max()) >= VOCAB_SIZE:
                    raise ValueError(
                        f"{src} holds tokens >= {VOCAB_SIZE} near token {start}: not GPT-2 tokens"
                    )
                write_shard(target, chunk)
            docs = int(np.count_nonzero(chunk == EOT))  # nanoGPT puts EOT after each document
            records.append({"name": target.name, "tokens": len(chunk), "documents": docs})
        log.info("%s: %d tokens into %d shard(s)", src, len(tokens), len(records))
        result[split] = records
    return result


def _already(path: Path, tokens: int) -> bool:
    try:
        return read_header(path) == tokens
    except (OSError, ValueError):
        return False
