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
import math
from dataclasses import dataclass, field
from pathlib import Path

from study.curves import read_curves

RESULTS, CURVES = "results.csv", "curves.csv.gz"


@dataclass
class Ledger:
    rows: dict[str, dict] = field(default_factory=dict)  # run id -> results.csv row, typed
    raw: dict[str, dict] = field(default_factory=dict)  # the same rows as written (strings)
    curves: dict[str, list[dict]] = field(default_factory=dict)  # run id -> curve records

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
    """The ledger in the study folder ``out`` (empty where it has none)."""
    ledger = Ledger()
    if (out / RESULTS).is_file():
        with open(out / RESULTS, newline="") as f:
            raw = list(csv.DictReader(f))
        for row, typed in zip(raw, read_csv(out / RESULTS)):
            run_id = row.get("run_dir") or ""
            if run_id.startswith("runs/"):  # merged rows are FILE:runs/...
                ledger.rows[run_id], ledger.raw[run_id] = typed, row
    if (out / CURVES).is_file():
        ledger.curves = {k: v for k, v in read_curves(out / CURVES).items() if k in ledger.rows}
    return ledger


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


def read_csv(path: Path) -> list[dict]:
    """results.csv back, numbers as floats (the report reads only this file)."""
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            for k, v in r.items():
                try:
                    r[k] = float(v)
                except (TypeError, ValueError):
                    pass
            rows.append(r)
    return rows
