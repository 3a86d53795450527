"""A study continues from its ledger (study/ledger.py): with every run directory gone, the
committed batch part (207 runs) is complete, nothing is pending, and its results.csv comes back
byte for byte from the ledger alone."""

import shutil
from pathlib import Path

from helpers import ROOT
from study.cli import parse, plan_of
from study.results import collect, write_csv
from study.state import Study

PART = ROOT / "results" / "referee" / "batch"
ARGS = ["--optimizers", "adamw", "mars-adamw", "--models", "proxy-100k", "--budgets", "1",
        "--reference-budgets", "--batch-tokens", "8192", "--center-from",
        str(ROOT / "results" / "referee" / "headline" / "results.csv"), "--center-cell", "proxy-100k:1"]  # fmt: skip


def study_from(out: Path) -> Study:
    args, extra = parse(["--out", str(out), *ARGS])
    return Study(plan_of(args, extra))


def test_a_part_without_run_directories_is_complete_from_its_ledger(tmp_path):
    for name in ("results.csv", "curves.csv.gz"):
        shutil.copy(PART / name, tmp_path / name)
    study = study_from(tmp_path)
    states = [study.update(c) for c in study.plan.cells()]
    assert all(s.done and not s.pending for s in states)
    rows, curves = collect(study)
    write_csv(rows, tmp_path / "again.csv")
    assert (tmp_path / "again.csv").read_text() == (PART / "results.csv").read_text()
    assert len(curves) == len(rows) == 207 and all(curves.values())


def test_without_a_ledger_every_run_is_pending(tmp_path):
    study = study_from(tmp_path)
    state = study.update(study.plan.cells()[0])
    assert state.pending and not state.done
