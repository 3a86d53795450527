"""The batch crossover's table and figure from its published files (docs/study.md, "The batch
crossover"):

    python -m study crossover report [--results results/crossover] [--batches 8192 2048 ...]

The crossover is a study defined as data (study/studies/crossover.yaml): proxy-100k for the
headline's 966 steps at every batch (the budget grows with the batch, 1x Chinchilla at 2,048
bytes, 4x at 8,192, 16x at 32,768, 64x at 131,072), three arms: AdamW, MARS-AdamW, and
MARS-AdamW with gamma = 0 (the correction switched off alone, every other value equal), so
``Delta_gamma(B) = L(gamma) - L(gamma = 0)`` isolates the correction at batch B. Each arm's lr
is tuned on its own line at every batch; every other knob is carried from the referee's batch
part. It runs, and continues after a stop, with

    python -m study run crossover [--part b8192 ...] [--jobs 2] [--device cuda] [--runs DIR]

which rewrites this table after each part (study/parts.py). ``report`` rewrites it alone, from
whatever the ledgers hold. ``corpus`` measures the training corpus once from its prepared shards
(``python -m study crossover corpus``: RESULTS/corpus.json, the tokens one epoch of proxy-100k's
windows holds), so the report gives each cell's epochs over its corpus from a record.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from study import definition as defs

ROOT = Path(__file__).resolve().parents[2]
RUN_HINT = "python -m study run crossover [--part b8192 ...]"


def budget_of(batch: int) -> float:
    """The budget (x Chinchilla) that gives the headline's 966 proxy-100k steps at ``batch``
    bytes a step: ``batch / 2048`` (the headline ran 1x at 2,048 bytes)."""
    if batch <= 0 or batch % 2048:
        raise ValueError(f"batch {batch}: a positive multiple of 2048 bytes (a micro-batch of 32 "
                         "sequences of 64 bytes)")  # fmt: skip
    return batch / 2048


def batches() -> list:
    """The definition's cells (study/findings/crossover_report.py ``Cell``: a proxy at a batch), in the
    order its parts run; a part that is no cell (a check such as b131072-fp32) left out."""
    from study.findings.crossover_report import Cell

    cells = (Cell.of(name) for name in defs.load("crossover").parts)
    return [c for c in cells if c is not None]


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m study crossover", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("command", help="report | corpus")
    ap.add_argument("--batches", nargs="+", type=int, default=None, metavar="BYTES",
                    help="proxy-100k's batches (default: the definition's cells)")  # fmt: skip
    ap.add_argument("--results", type=Path, default=ROOT / "results" / "crossover",
                    help="the published ledgers (results/crossover/b<B>/)")  # fmt: skip
    args = ap.parse_args(argv)
    if args.command in ("run", "publish"):
        ap.error(f"{args.command}: the crossover runs as a study defined as data: "
                 f"{RUN_HINT.replace('run', args.command, 1)}")  # fmt: skip
    if args.command not in ("report", "corpus"):
        ap.error(f"{args.command!r}: the command is report or corpus")
    args.batches = args.batches or batches()
    return args


def corpus_record(data: str = "sotu-bytes", model: str = "proxy-100k", cfg=None) -> dict:  # noqa: ANN001
    """The training corpus of ``data`` (configs/data/<data>.yaml, its prepared shards) as
    ``model``'s windows see it: the train shards' tokens and the tokens one epoch of windows
    holds (every shard's ``(L - 1) // T`` windows of T tokens: data/windows.py). ``cfg``: a
    DataConfig in place of the file's (a fixture corpus)."""
    from data.config import DataConfig, shard_files
    from data.shards import read_header
    from data.windows import window_counts
    from runtime.config_files import load_config
    from study.plan import model_config

    cfg = cfg or DataConfig(**load_config(f"data/{data}"))
    train, _val = shard_files(cfg)
    lengths = [read_header(p) for p in train]
    seq_len = model_config(model).block_size
    return {"data": data, "model": model, "seq_len": seq_len, "train_shards": len(train),
            "train_tokens": sum(lengths),
            "epoch_tokens": int(window_counts(lengths, seq_len).sum()) * seq_len}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse(list(sys.argv[1:] if argv is None else argv))
    if args.command == "corpus":
        import json

        record = corpus_record()
        (args.results / "corpus.json").write_text(json.dumps(record, indent=1) + "\n")
        print(json.dumps(record))
        return 0
    from study.findings.crossover_report import write

    print(write(args.results, args.batches))
    return 0
