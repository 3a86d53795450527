"""A study's ledger: its results.csv (one row per finished run, every value it ran with) and
curves.csv.gz, read back so that a study continues from them where its run directories are gone
(a fresh clone, another machine): a run the ledger holds is finished, and the report keeps its
row and curves.

A run's id is its directory relative to the study's folder (the ``run_dir`` column, e.g.
``runs/proxy-100k/4x/adamw/select/lr-0.004_seed-0``); rows merged from other studies
(``--merge``: an id with ``FILE:`` in front) are not this study's runs and are left out.
"""

from __future__ import annotations

import csv
import functools
import math
from dataclasses import dataclass, field
from pathlib import Path

from study.curves import read_curves

RESULTS, CURVES = "results.csv", "curves.csv.gz"
# a study folder -> the folder whose ledger it reads where it has none of its own: a dry run of
# ``python -m study run`` reads each part's published ledger in place (it copies nothing)
SOURCES: dict[Path, Path] = {}


@dataclass
class Ledger:
    rows: dict[str, dict] = field(default_factory=dict)  # run id -> results.csv row, typed
    raw: dict[str, dict] = field(default_factory=dict)  # the same rows as written (strings)
    curves: dict[str, list[dict]] = field(default_factory=dict)  # run id -> curve records
    lines: dict[str, int] = field(default_factory=dict)  # run id -> its line in the file
    path: Path | None = None  # the file read (None: none)

    def loss(self, run_id: str, max_steps: int) -> float | None:
        """The ledger's end-of-run loss of ``run_id`` (inf: diverged); None when it has no
        finished run of that id and length."""
        row = self.rows.get(run_id)
        if row is None or row.get("max_steps") != float(max_steps):
            return None
        loss = row.get("final_val_loss")
        if row.get("diverged") == 1.0 or not isinstance(loss, float) or not math.isfinite(loss):
            return math.inf
        return loss


def load(out: Path) -> Ledger:
    """The ledger in the study folder ``out`` (empty where it has none), every row checked
    (``read_rows``; a run id twice: refused, never one kept in place of the other)."""
    ledger = Ledger()
    if not (out / RESULTS).is_file():
        out = SOURCES.get(Path(out).resolve(), out)
    if (out / RESULTS).is_file():
        ledger.path = out / RESULTS
        header, rows = read_rows(out / RESULTS)
        for line, values in rows:
            row = dict(zip(header, values))
            run_id = row.get("run_dir") or ""
            if not run_id.startswith("runs/"):  # merged rows are FILE:runs/...
                continue
            if run_id in ledger.rows:
                raise LedgerError(f"{out / RESULTS}:{line}: run {run_id} a second time (its first "
                                  f"row is line {ledger.lines[run_id]}): one row per run: "
                                  f"{FIX.replace('FILE', str(out / RESULTS))}")  # fmt: skip
            ledger.rows[run_id], ledger.raw[run_id] = _typed(row), row
            ledger.lines[run_id] = line
    if (out / CURVES).is_file():
        check_checksum(out / CURVES)
        ledger.curves = {k: v for k, v in read_curves(out / CURVES).items() if k in ledger.rows}
    return ledger


def _typed(row: dict) -> dict:
    """A row's numbers as floats (read_csv's)."""
    out = dict(row)
    for k, v in row.items():
        try:
            out[k] = float(v)
        except (TypeError, ValueError):
            pass
    return out


def split_spec(spec: str) -> tuple[Path, str] | None:
    """``results/referee/batch/results.csv:runs/proxy-100k/...`` -> (the ledger, the run id);
    None for anything else (a run directory)."""
    path, sep, run_id = str(spec).partition(".csv:")
    return (Path(path + ".csv"), run_id) if sep else None


def ledger_row(spec: str) -> dict:
    """The typed row of ``LEDGER.csv:RUN_ID``, with its recorded command; a one-line
    SystemExit naming what is missing."""
    split = split_spec(spec)
    if split is None:
        raise SystemExit(f"{spec}: not LEDGER.csv:RUN_ID")
    path, run_id = split
    if not path.is_file():
        raise SystemExit(f"{spec}: no ledger {path} (a study's results.csv)")
    rows = [r for r in read_csv(path) if r.get("run_dir") == run_id]
    if not rows:
        raise SystemExit(f"{spec}: {path} has no run {run_id!r} (its run_dir column names them)")
    if not isinstance(rows[0].get("command"), str) or not rows[0]["command"]:
        raise SystemExit(f"{spec}: the row records no command (written before ledgers did)")
    return rows[0]


def overrides_of(spec: str) -> list[str]:
    """A finished run's train.py overrides (no out_dir), from its ledger row."""
    import shlex

    return shlex.split(ledger_row(spec)["command"])


class LedgerError(SystemExit):
    """A ledger that cannot be trusted: one line naming the file (and line), what is wrong and
    how to get a good one back. Nothing was read from it and nothing was written."""


CHECKSUMS = "checksums.sha256"  # a published folder's: ``sha256sum -c`` reads it too
FIX = "restore it (git checkout -- FILE) or publish it again from its run tree"
FIXED_COLUMNS = {
    "optimizer",
    "model",
    "non_embedding_params",
    "budget",
    "tokens",
    "lr",
    "seed",
    "role",
    "final_val_loss",
    "best_val_loss",
    "wall_s",
    "tokens_per_s",
    "commit",
    "max_steps",
    "warmup_steps",
    "min_lr_ratio",
    "batch_tokens",
    "chosen",
    "grid",
    "diverged",
    "collapsed",
    "collapse",
    "run_dir",
    "cpu",
    "command",
    "routes",
    "device",
    "dtype",
    "tf32",
    "resumed",
    "adamw_lr",
    "lr_1d",
}  # fmt: skip  (study/results.py's columns, and ran_values' carried ones)
REQUIRED = ("optimizer",)  # every other column is checked where it is there
FLAGS = ("chosen", "diverged", "collapsed")  # 0 or 1
ROLES = ("select", "eval")


@functools.cache
def known_columns() -> frozenset[str]:
    """Every column a study writes: results.py's, the knobs, and any registered optimizer's
    config field (a variant tunes its own key: ``mars-adamw:eps=tuned`` writes ``eps``)."""
    from study.knobs import KNOBS
    from trainer.cli_checks import optimizer_fields

    fields = {k for schema in optimizer_fields().values() for k in schema}
    return frozenset(FIXED_COLUMNS | set(KNOBS) | fields)


@functools.cache
def _max_loss(model: str) -> float:
    """A plausible loss is below the log of the model's vocabulary (a uniform guess)."""
    try:
        from study.plan import model_config

        return math.log(model_config(model).vocab_size)
    except (ValueError, KeyError, SystemExit):
        return math.log(2**17)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def check_checksum(path: Path) -> None:
    """A published ledger's checksum (``checksums.sha256`` beside it, written by ``publish``)
    against its bytes: an edit by hand since it was published is refused in one line. A folder
    without one (published before checksums were) is read as it is."""
    import hashlib

    sums = Path(path).parent / CHECKSUMS
    if not sums.is_file():
        return
    want = {}
    for line in sums.read_text(encoding="utf-8", errors="replace").splitlines():
        digest, _, name = line.partition("  ")
        want[name.strip()] = digest.strip()
    if Path(path).name not in want:
        return
    have = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    if have != want[Path(path).name]:
        raise LedgerError(f"{path}: its bytes do not match its checksum in {sums} (edited since it "
                          f"was published?): {FIX.replace('FILE', str(path))}")  # fmt: skip


def write_checksums(
    folder: Path, names: tuple[str, ...] = ("results.csv", "curves.csv.gz")
) -> None:
    """``checksums.sha256`` of a published folder: the sha256 of each of ``names`` there."""
    import hashlib

    from runtime.files import atomic_open

    lines = [f"{hashlib.sha256((folder / n).read_bytes()).hexdigest()}  {n}\n" for n in names
             if (folder / n).is_file()]  # fmt: skip
    if lines:
        with atomic_open(folder / CHECKSUMS, "w") as f:
            f.write("".join(lines))


def read_text(path: Path) -> str:
    """A ledger's text: UTF-8, else one line naming the line and the byte that is not."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise LedgerError(f"{path}:{line}: not UTF-8 text (byte {data[exc.start]:#04x}): a ledger "
                          f"is written by the study; {FIX.replace('FILE', str(path))}") from None  # fmt: skip


def check_rows(path: Path, header: list[str], rows: list[tuple[int, list[str]]]) -> None:
    """Every row of a ledger as a study writes it (LedgerError at the first that is not): known
    columns, one value per column; where given, a role, a whole seed, a positive budget, 0 or 1
    flags, a plausible loss (finite, above 0, below the log of the vocabulary; a diverged row's
    may be anything but negative); one row per run (its run_dir, cell, role and seed)."""
    unknown = [c for c in header if c not in known_columns()]
    if unknown or len(set(header)) != len(header):
        what = f"unknown column {unknown[0]!r}" if unknown else "a column named twice"
        raise LedgerError(f"{path}:1: {what} (not a study's results.csv, or edited by hand): "
                          f"{FIX.replace('FILE', str(path))}")  # fmt: skip
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise LedgerError(f"{path}:1: no {missing[0]!r} column (not a study's results.csv): "
                          f"{FIX.replace('FILE', str(path))}")  # fmt: skip
    seen: dict[tuple, int] = {}
    for line, values in rows:

        def bad(why: str, at: int = line) -> LedgerError:
            return LedgerError(f"{path}:{at}: {why}: {FIX.replace('FILE', str(path))}")

        if len(values) != len(header):
            raise bad(f"{len(values)} values where the header has {len(header)} columns")
        row = {k: v for k, v in zip(header, values) if v != ""}
        if "role" in row and row["role"] not in ROLES:
            raise bad(f"role {row['role']!r} (select or eval)")
        seed = _number(row.get("seed", "0"))
        if seed is None or not seed.is_integer() or seed < 0:
            raise bad(f"seed {row['seed']!r} (a whole number, 0 or more)")
        for col in ("budget", "max_steps", "batch_tokens", "tokens", "non_embedding_params"):
            n = _number(row.get(col, "1"))
            if n is None or not math.isfinite(n) or n < 0 or (col == "budget" and n == 0):
                raise bad(f"{col} {row[col]!r} (a positive number)")
        for flag in FLAGS:
            if _number(row.get(flag, "0")) not in (0.0, 1.0):
                raise bad(f"{flag} {row[flag]!r} (0 or 1)")
        diverged = _number(row.get("diverged", "")) == 1.0
        top = _max_loss(row.get("model", ""))
        for col in ("final_val_loss", "best_val_loss"):
            if col not in row:
                continue
            loss = _number(row[col])
            if diverged and loss is not None and (math.isnan(loss) or loss > 0):
                continue
            if loss is None or not math.isfinite(loss) or not 0 < loss <= top:
                raise bad(f"{col} {row[col]!r} (a finished run's loss is a finite number above 0 "
                          f"and below {top:.3f}, the log of the vocabulary)")  # fmt: skip
        if "run_dir" not in row:
            continue
        key = tuple(row.get(k) for k in ("run_dir", "optimizer", "model", "budget", "role", "seed"))
        if key in seen:
            raise bad(f"run {row['run_dir']} a second time (its first row is line {seen[key]}): "
                      "one row per run")  # fmt: skip
        seen[key] = line


def read_rows(path: Path) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """A ledger's header and rows (each with its line number), checked (``check_checksum``,
    ``read_text``, ``check_rows``)."""
    import io

    path = Path(path)
    check_checksum(path)
    text = read_text(path)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, [])
        rows = []
        for values in reader:
            if values:
                rows.append((reader.line_num, values))
    except csv.Error as exc:
        raise LedgerError(
            f"{path}:{reader.line_num}: {exc}: {FIX.replace('FILE', str(path))}"
        ) from None
    if not header:
        raise LedgerError(f"{path}: empty (no header): {FIX.replace('FILE', str(path))}")
    check_rows(path, header, rows)
    return header, rows


def read_raw(path: Path) -> list[dict]:
    """A ledger's rows as written (strings), checked."""
    header, rows = read_rows(path)
    return [dict(zip(header, values)) for _, values in rows]


def read_csv(path: Path) -> list[dict]:
    """results.csv back, numbers as floats (the report reads only this file), every row
    checked first (``read_rows``: a bad one is one line naming the file and line)."""
    return [_typed(r) for r in read_raw(path)]
