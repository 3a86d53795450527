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
        "--baseline-budgets", "--batch-tokens", "8192", "--center-from",
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


def _overrides(command: str) -> dict[str, str]:
    import shlex

    return dict(a.split("=", 1) for a in shlex.split(command) if "=" in a)


def test_every_ledger_row_records_the_values_its_run_ran_with():
    """Each committed row's knobs (carried ones included) equal its recorded command's values:
    the rows were once written from the study's plan, and a carried knob could differ from what
    ran (widthinit's AdamW at 0.5x and 1x recorded wd 1e-05 and warmup 0.05; they ran 0.3162
    and 0.4)."""
    import math

    from study.knobs import beta_field
    from study.plan import split_variant
    from study.results import read_csv

    checked = 0
    for path in sorted((ROOT / "results").glob("*/*/results.csv")):
        for r in read_csv(path):
            if not isinstance(r.get("command"), str) or not r["command"]:
                continue
            o = _overrides(r["command"])
            base = split_variant(r["optimizer"])[0]
            assert float(o["optimizer.lr"]) == r["lr"], (path, r["run_dir"])
            for key, col in (("optimizer.aux_lr", "aux_lr"), ("optimizer.weight_decay", "wd")):
                if key in o:
                    assert float(o[key]) == r[col], (path, r["run_dir"], col)
            field = beta_field(base) if "beta2" in r and isinstance(r["beta2"], float) else None
            if field == "betas" and "optimizer.betas" in o:
                assert float(o["optimizer.betas"].strip("[]").split(",")[1]) == r["beta2"]
            if "schedule.warmup_steps" in o and isinstance(r.get("warmup"), float):
                steps = int(o["max_steps"])
                assert max(1, round(r["warmup"] * steps)) == int(o["schedule.warmup_steps"]) or (
                    math.isclose(r["warmup"], int(o["schedule.warmup_steps"]) / steps, rel_tol=1e-3)
                ), (path, r["run_dir"])
            checked += 1
    assert checked >= 3000


def test_a_ledger_row_gives_its_runs_command_to_rerun_and_predict(tmp_path):
    from study import ledger
    from study.rerun import recorded

    row_id = (
        "runs/proxy-100k/1x/adamw/eval/lr-0.008_aux_lr-0.512_wd-0.3162_beta2-0.95_warmup-0.4_seed-1"
    )
    spec = f"{PART / 'results.csv'}:{row_id}"
    overrides, commit, summary = recorded(spec)
    assert (
        "optimizer=adamw" in overrides
        and "seed=1" in overrides
        and "batch_tokens=8192" in overrides
    )
    assert not any(o.startswith("out_dir=") for o in overrides)
    assert summary["final_val_loss"] > 0 and commit
    import pytest

    with pytest.raises(SystemExit, match="has no run"):
        ledger.ledger_row(f"{PART / 'results.csv'}:runs/nope")
    with pytest.raises(SystemExit, match="no ledger"):
        ledger.ledger_row(f"{tmp_path / 'x.csv'}:runs/a")


def test_a_parts_report_comes_back_byte_for_byte_from_its_ledger(tmp_path):
    """The batch part's report, ledger and curves, made again from its committed ledger alone
    (no run directory anywhere), equal the committed files byte for byte."""
    from study.cli import main

    for name in ("results.csv", "curves.csv.gz", "started.txt"):
        shutil.copy(PART / name, tmp_path / name)
    assert main(["--out", str(tmp_path), *ARGS, "--report-only"]) == 0
    for name in ("report.md", "results.csv", "curves.csv.gz"):
        assert (tmp_path / name).read_bytes() == (PART / name).read_bytes(), name


def test_curves_read_back_and_written_again_are_the_same_bytes(tmp_path):
    """A token count written from a run directory as a whole number (1024000) stays one when a
    fresh clone republishes the curves from the ledger (it came back as 1.024e+06 once)."""
    from study.curves import read_curves, write_curves

    first = tmp_path / "a.csv.gz"
    curves = {"runs/x": [{"kind": "train", "step": 500, "tokens": 1024000, "loss": 2.07624,
                          "lr": 0.022}, {"kind": "val", "step": 966, "tokens": 1978368,
                                         "loss": 1.70879}]}  # fmt: skip
    write_curves(curves, first)
    again = tmp_path / "b.csv.gz"
    write_curves(read_curves(first), again)
    assert again.read_bytes() == first.read_bytes()
    write_curves(read_curves(again), first)
    assert again.read_bytes() == first.read_bytes()
