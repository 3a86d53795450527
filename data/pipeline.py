"""The streaming half of ``data.prepare``: tokenize documents in parallel, in order, and write
them into shards as they fill, with a progress record that lets an interrupted run resume.

Memory stays bounded whatever the dataset size: documents are read lazily, at most
``2 * workers`` batches are in flight, and shard tokens go straight to a hidden partial file
(``.NAME.partial``) that is renamed to ``NAME`` when the shard is full (so a shard appears under
its name only when complete). After every batch that completes a shard, the partial files are
fsynced and ``prepare.progress.json`` records the position: documents consumed, the finished
shards and the length of each partial file. A resumed run truncates the partial files to that
length and goes on from that document, which gives the same bytes as an uninterrupted run.
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

from data.shards import HEADER_BYTES, HEADER_INTS, MAGIC, VERSION, read_header
from data.tokenizer import get_tokenizer
from data.vocabs import encode, get_vocab
from runtime.files import atomic_open

log = logging.getLogger("data.prepare")

PROGRESS_FILE = "prepare.progress.json"
BATCH_DOCS = 512  # documents per tokenizer task
BATCH_CHARS = 4_000_000  # ... or fewer, so that a task's text stays a few MB


class ResumeError(ValueError):
    """The progress record does not match the files on disk; the run starts afresh."""


# ---------------------------------------------------------------- tokenization


def encode_batch(texts: list[str], tokenizer: str = "gpt2") -> tuple[np.ndarray, np.ndarray]:
    """Tokenize documents as ``[EOT] + encode_ordinary(text)`` each; return the tokens of all
    of them concatenated (uint16) and each document's length (int64)."""
    eot = get_vocab(tokenizer).eot
    parts = [encode(tokenizer, text) for text in texts]
    lengths = np.array([len(p) + 1 for p in parts], dtype=np.int64)
    tokens = np.empty(int(lengths.sum()), dtype=np.uint16)
    start = 0
    for part, n in zip(parts, lengths.tolist()):
        tokens[start] = eot
        tokens[start + 1 : start + n] = part
        start += n
    return tokens, lengths


def _batched(texts: Iterable[str]) -> Iterator[list[str]]:
    batch: list[str] = []
    chars = 0
    for text in texts:
        batch.append(text)
        chars += len(text)
        if len(batch) >= BATCH_DOCS or chars >= BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def encoded_batches(
    texts: Iterable[str], *, workers: int, tokenizer: str = "gpt2"
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``encode_batch`` over batches of ``texts``, in order, on ``workers`` processes.

    ``Pool.imap`` would read the whole input ahead of the workers; here at most ``2 * workers``
    batches are queued, so memory stays bounded when reading is faster than tokenizing."""
    if workers <= 1:
        yield from (encode_batch(b, tokenizer) for b in _batched(texts))
        return
    # spawn, not fork: a fork copies the caller's locks but not its threads (torch's, a test
    # runner's, a study's), and a child that meets a lock a missing thread held waits for ever
    with mp.get_context("spawn").Pool(workers, initializer=get_tokenizer) as pool:
        pending: deque = deque()
        for batch in _batched(texts):
            pending.append(pool.apply_async(encode_batch, (batch, tokenizer)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


# ---------------------------------------------------------------- shard writer


def _header(num_tokens: int, tokenizer_id: int = 0) -> bytes:
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:4] = (MAGIC, VERSION, num_tokens, tokenizer_id)
    return header.tobytes()


class ShardWriter:
    """Writes a token stream as shards of exactly ``shard_tokens`` tokens (the last may be
    shorter), named ``name(i)`` for i = first, first + 1, ...; counts the documents that start in
    each shard."""

    def __init__(
        self, out_dir: Path, name: Callable[[int], str], shard_tokens: int, *, first: int = 0,
        tokenizer_id: int = 0,
    ) -> None:  # fmt: skip
        self.out_dir, self.name, self.shard_tokens = out_dir, name, shard_tokens
        self.tokenizer_id = tokenizer_id
        self.index = first  # the shard being filled
        self.partial_tokens = 0
        self.partial_documents = 0
        self.shards: list[dict] = []  # finished: {"name", "tokens", "documents"}
        self._file = None

    def _partial_path(self) -> Path:
        return self.out_dir / f".{self.name(self.index)}.partial"

    def add(self, tokens: np.ndarray, lengths: np.ndarray) -> int:
        """Append whole documents (their tokens and lengths); return the shards finished."""
        doc_starts = np.cumsum(lengths) - lengths
        finished, pos = 0, 0
        while pos < len(tokens):
            if self._file is None:
                self._file = open(self._partial_path(), "wb")
                self._file.write(_header(0, self.tokenizer_id))
            take = min(self.shard_tokens - self.partial_tokens, len(tokens) - pos)
            self._file.write(tokens[pos : pos + take].tobytes())
            lo, hi = np.searchsorted(doc_starts, [pos, pos + take])
            self.partial_documents += int(hi - lo)
            self.partial_tokens += take
            pos += take
            if self.partial_tokens == self.shard_tokens:
                self._finish()
                finished += 1
        return finished

    def _finish(self) -> None:
        """Write the header, fsync, and rename the partial file to the shard's name."""
        f, self._file = self._file, None
        f.seek(0)
        f.write(_header(self.partial_tokens, self.tokenizer_id))
        f.flush()
        os.fsync(f.fileno())
        f.close()
        os.replace(self._partial_path(), self.out_dir / self.name(self.index))
        self.shards.append(
            {
                "name": self.name(self.index),
                "tokens": self.partial_tokens,
                "documents": self.partial_documents,
            }
        )
        self.index += 1
        self.partial_tokens = self.partial_documents = 0

    def close(self) -> None:
        """Finish the last, shorter shard."""
        if self._file is not None:
            self._finish()

    def abandon(self) -> None:
        """Close the partial file as it is (an interrupted run keeps it to resume from)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def sync(self) -> dict:
        """Make the partial file durable and return the writer's state for the progress file."""
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
        return {
            "index": self.index,
            "partial_tokens": self.partial_tokens,
            "partial_documents": self.partial_documents,
            "shards": list(self.shards),
        }

    def restore(self, state: dict) -> None:
        """Continue from ``state`` (from ``sync``); raise ResumeError if the files disagree."""
        for shard in state["shards"]:
            path = self.out_dir / shard["name"]
            try:
                ok = read_header(path) == shard["tokens"]
            except (OSError, ValueError):
                ok = False
            if not ok:
                raise ResumeError(f"finished shard {path} is missing or differs from the record")
        self.shards = list(state["shards"])
        self.index = int(state["index"])
        self.partial_tokens = int(state["partial_tokens"])
        self.partial_documents = int(state["partial_documents"])
        if self.partial_tokens:
            self._file = self._reopen_partial(HEADER_BYTES + 2 * self.partial_tokens)

    def _reopen_partial(self, size: int):
        path = self._partial_path()
        if path.is_file() and path.stat().st_size >= size:
            f = open(path, "r+b")
        else:
            # The shard was finished and renamed after the record was written: take its start.
            final = self.out_dir / self.name(self.index)
            try:
                if read_header(final) < self.partial_tokens:
                    raise ResumeError(f"{final} is shorter than the recorded partial shard")
            except (OSError, ValueError) as exc:
                raise ResumeError(f"partial shard {path} is missing or short ({exc})") from exc
            log.debug("%s was finished after the record: resuming from its start", final)
            with open(final, "rb") as src:
                data = src.read(size)
            f = open(path, "w+b")
            f.write(data)
        f.truncate(size)  # drop what was written after the record
        f.seek(size)
        return f


# ---------------------------------------------------------------- progress record


def save_progress(out_dir: Path, state: dict) -> None:
    """Write the progress record atomically."""
    with atomic_open(out_dir / PROGRESS_FILE, "w") as f:
        json.dump(state, f, indent=1)


def load_progress(out_dir: Path, settings: dict) -> dict | None:
    """The progress record of an interrupted run with the same settings, if there is one."""
    path = out_dir / PROGRESS_FILE
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if state.get("settings") != settings:
        log.info("%s was made with other settings: starting afresh", path)
        return None
    return state


def remove_partials(out_dir: Path, keep: Iterable[Path] = ()) -> None:
    """Delete partial shard files left by an earlier run (except ``keep``)."""
    keep = {Path(p).name for p in keep}
    for path in out_dir.glob(".*.partial"):
        if path.name not in keep:
            path.unlink()


# ---------------------------------------------------------------- the run


def make_writers(
    out_dir: Path, prefix: str, layout: str, shard_tokens: int, tokenizer: str = "gpt2"
) -> dict:
    """The writers of a layout: "split" has a train and a val stream of shards numbered from 0;
    "first-shard" (llm.c's) has one stream whose shard 0 is ``{prefix}_val_000000.bin`` and whose
    later shards are ``{prefix}_train_000001.bin``, ..."""
    if layout == "split":
        return {
            split: ShardWriter(
                out_dir,
                lambda i, s=split: f"{prefix}_{s}_{i:06d}.bin",
                shard_tokens,
                tokenizer_id=get_vocab(tokenizer).shard_id,
            )
            for split in ("train", "val")
        }
    if layout == "first-shard":
        return {
            "all": ShardWriter(
                out_dir,
                lambda i: f"{prefix}_{'val' if i == 0 else 'train'}_{i:06d}.bin",
                shard_tokens,
                tokenizer_id=get_vocab(tokenizer).shard_id,
            )
        }
    raise ValueError(f"unknown layout {layout!r}; valid layouts: split, first-shard")


def _route(writers: dict, val_ids: np.ndarray | None, first: int, tokens, lengths) -> int:
    """Hand a batch (documents first, first + 1, ...) to the writers; return shards finished."""
    if "all" in writers:
        return writers["all"].add(tokens, lengths)
    ids = np.arange(first, first + len(lengths))
    pos = np.minimum(np.searchsorted(val_ids, ids), len(val_ids) - 1)
    is_val = val_ids[pos] == ids
    edges = [0, *(np.flatnonzero(np.diff(is_val.astype(np.int8))) + 1).tolist(), len(ids)]
    tok_edges = np.concatenate([[0], np.cumsum(lengths)])
    finished = 0
    for a, b in zip(edges[:-1], edges[1:]):
        writer = writers["val" if is_val[a] else "train"]
        finished += writer.add(tokens[tok_edges[a] : tok_edges[b]], lengths[a:b])
    return finished


def _resume(out_dir: Path, settings: dict, writers: dict) -> tuple[int, float]:
    """Restore the writers from the progress record; return (documents done, seconds spent)."""
    state = load_progress(out_dir, settings)
    if state is not None:
        try:
            for key, writer in writers.items():
                writer.restore(state["writers"][key])
            keep = [w._partial_path() for w in writers.values() if w.partial_tokens]
            remove_partials(out_dir, keep)
            done = int(state["documents_done"])
            log.info("resuming %s after %d documents", out_dir, done)
            return done, float(state["seconds"])
        except (ResumeError, KeyError, TypeError) as exc:
            log.warning("cannot resume from %s (%s): starting afresh", PROGRESS_FILE, exc)
            for w in writers.values():
                w.abandon()
    for key, writer in writers.items():  # a fresh start
        writers[key] = ShardWriter(
            out_dir, writer.name, writer.shard_tokens, first=0, tokenizer_id=writer.tokenizer_id
        )
    remove_partials(out_dir)
    return 0, 0.0


def run(
    documents: Callable[[int], Iterable[str]],
    out_dir: Path,
    settings: dict,
    writers: dict,
    *,
    val_ids: np.ndarray | None = None,
    workers: int = 1,
    progress: bool = False,
    total_documents: int | None = None,
    stop_after: int | None = None,
) -> dict | None:
    """Tokenize ``documents(start)`` into ``writers``, resuming a matching interrupted run.

    Returns the finished shards ``{writer key: [shard records]}`` and the seconds spent (over
    all resumed runs), or None when ``stop_after`` shards were finished and the run stopped
    early, resumable."""
    from tqdm.auto import tqdm

    out_dir.mkdir(parents=True, exist_ok=True)
    done, seconds = _resume(out_dir, settings, writers)
    t0 = time.perf_counter()
    bar = tqdm(
        total=total_documents, initial=done, unit="doc", unit_scale=True, disable=not progress
    )
    batches = encoded_batches(
        documents(done), workers=workers, tokenizer=settings.get("tokenizer", "gpt2")
    )
    finished_here, tokens_here = 0, 0
    try:
        for tokens, lengths in batches:
            finished = _route(writers, val_ids, done, tokens, lengths)
            done += len(lengths)
            tokens_here += len(tokens)
            bar.update(len(lengths))
            bar.set_postfix_str(f"{tokens_here / 1e6:,.1f}M tokens", refresh=False)
            if finished:
                finished_here += finished
                state = {k: w.sync() for k, w in writers.items()}
                elapsed = seconds + time.perf_counter() - t0
                record = {"settings": settings, "documents_done": done, "seconds": elapsed}
                save_progress(out_dir, {**record, "writers": state})
                if stop_after is not None and finished_here >= stop_after:
                    log.info("stopped after %d shards; run again to continue", finished_here)
                    return None
        for writer in writers.values():
            writer.close()
    finally:
        batches.close()
        for writer in writers.values():
            writer.abandon()
        bar.close()
    return {
        "shards": {k: w.shards for k, w in writers.items()},
        "seconds": seconds + time.perf_counter() - t0,
    }
