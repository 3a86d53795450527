"""Ledgers validated on every read (issue 66): a bad row of a part's results.csv (a loss of
``abc``, NaN, -1e9 or inf, a short row, a forged duplicate, bytes that are not UTF-8, an unknown
column) is refused in one line naming the file and line, by ``--report-only``, ``study run``
and ``study.summary``, and the ledger is left byte for byte; a ledger is never rewritten with
fewer or other rows than it read; a published ledger's checksum is checked by its readers.
Issue 64: every row records the run's dtype and TF32 setting."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import pytest
import yaml

from helpers import ROOT
from study import ledger, parts
from study.cli import main

PART = ROOT / "results" / "referee" / "batch"
ARGS = ["--optimizers", "adamw", "mars-adamw", "--models", "proxy-100k", "--budgets", "1",
        "--baseline-budgets", "--batch-tokens", "8192", "--center-from",
        str(ROOT / "results" / "referee" / "headline" / "results.csv"), "--center-cell",
        "proxy-100k:1"]  # fmt: skip


def _rows(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text, newline="")))


def _write(rows: list[list[str]]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\r\n").writerows(rows)
    return out.getvalue()


def _edit(kind: str) -> tuple[bytes, int]:
    """The batch part's ledger with one bad row (its bytes), and the line it is on."""
    text = (PART / "results.csv").read_text()
    rows = _rows(text)
    header = rows[0]
    loss = header.index("final_val_loss")
    line = 5  # the file's line: row 4
    row = list(rows[line - 1])
    if kind in ("abc", "nan", "-1e9", "inf"):
        row[loss] = kind
        rows[line - 1] = row
    elif kind == "short":
        rows[line - 1] = row[:-3]
    elif kind == "duplicate":  # a forged copy of a real row, loss 0.5, after it
        row[loss] = "0.5"
        rows.insert(line, row)
        line += 1
    elif kind == "column":
        rows[0] = [*header[:-1], "notes"]
        line = 1
    data = _write(rows).encode()
    if kind == "latin1":
        data = data.replace(b"proxy-100k", "proxy-100k\u00e9".encode("latin-1"), 5)
        line = 2
    return data, line


KINDS = ["abc", "nan", "-1e9", "inf", "short", "duplicate", "column", "latin1"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_bad_row_is_one_line_naming_the_file_and_line_and_the_ledger_is_unchanged(tmp_path,
                                                                                   kind):  # fmt: skip
    bad, line = _edit(kind)
    (tmp_path / "results.csv").write_bytes(bad)
    shutil.copy(PART / "curves.csv.gz", tmp_path / "curves.csv.gz")
    for extra in (["--report-only"], ["--dry-run"]):
        with pytest.raises(SystemExit) as exc:
            main(["--out", str(tmp_path), *ARGS, *extra])
        text = str(exc.value.code)
        assert "\n" not in text and text.startswith(f"{tmp_path / 'results.csv'}:{line}: "), text
        assert (tmp_path / "results.csv").read_bytes() == bad
        assert not (tmp_path / "report.md").exists()


@pytest.mark.parametrize("kind", ["nan", "-1e9", "duplicate", "latin1"])
def test_study_summary_refuses_a_bad_published_ledger_in_one_line(tmp_path, kind):
    results = tmp_path / "results"
    shutil.copytree(ROOT / "results" / "referee", results / "referee")
    target = results / "referee" / "headline" / "results.csv"
    rows = _rows(target.read_text())
    loss = rows[0].index("final_val_loss")
    if kind == "duplicate":
        rows.insert(3, [*rows[2][:loss], "0.5", *rows[2][loss + 1 :]])
        data, line = _write(rows).encode(), 4
    elif kind == "latin1":
        data, line = target.read_bytes().replace(b"adamw", b"adamw\xe9", 1), 2
    else:
        rows[2][loss] = kind
        data, line = _write(rows).encode(), 3
    target.write_bytes(data)
    from study import summary

    with pytest.raises(SystemExit) as exc:
        summary.main(["--results", str(results)])
    text = str(exc.value.code)
    assert "\n" not in text and text.startswith(f"{target}:{line}: "), text
    assert not (results / "summary.md").exists() and target.read_bytes() == data


def test_every_published_ledger_reads_clean():
    for path in sorted((ROOT / "results").glob("**/results.csv")):
        assert ledger.read_csv(path), path


def test_a_published_ledger_carries_a_checksum_that_its_readers_check(tmp_path):
    """publish writes checksums.sha256 (sha256sum's format) beside the ledger; an edit by hand
    afterwards, even one that reads as a good row, is refused by every reader and by a run's
    restore, in one line."""
    folder = tmp_path / "pub"
    folder.mkdir()
    for name in ("results.csv", "curves.csv.gz"):
        shutil.copy(PART / name, folder / name)
    ledger.write_checksums(folder)
    sums = (folder / "checksums.sha256").read_text().splitlines()
    assert [line.split("  ")[1] for line in sums] == ["results.csv", "curves.csv.gz"]
    assert len(ledger.read_csv(folder / "results.csv")) == 207  # as published: read
    text = (folder / "results.csv").read_text()
    first = text.split("\n")[1]
    edited = first.replace(first.split(",")[8], "1.2000000000000002", 1)  # a plausible loss
    (folder / "results.csv").write_text(text.replace(first, edited, 1))
    with pytest.raises(SystemExit, match=r"do not match its checksum in .*checksums.sha256"):
        ledger.read_csv(folder / "results.csv")
    # a run's restore refuses it too (never copied into a run tree)
    part = parts.Part("s", "p", {}, tmp_path / "runs" / "p", folder)
    d = parts.Definition("s", {"p": part}, ["p"], {}, [])
    with pytest.raises(SystemExit, match="do not match its checksum"):
        parts.restore(d)
    assert not (tmp_path / "runs").exists()


def test_a_ledger_is_never_rewritten_with_fewer_rows_than_it_read(tmp_path):
    """A row of a run that the plan does not have (another budget, say): --report-only refuses
    to drop it, naming its line, and writes nothing."""
    text = (PART / "results.csv").read_text()
    rows = _rows(text)
    extra = list(rows[3])
    run_dir = rows[0].index("run_dir")
    extra[run_dir] = extra[run_dir].replace("/1x/", "/3x/")
    rows.append(extra)
    data = _write(rows).encode()
    (tmp_path / "results.csv").write_bytes(data)
    shutil.copy(PART / "curves.csv.gz", tmp_path / "curves.csv.gz")
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path), *ARGS, "--report-only"])
    text = str(exc.value.code)
    assert text.startswith(f"{tmp_path / 'results.csv'}:{len(rows)}: run {extra[run_dir]} is not")
    assert "would lose it; nothing was written" in text
    assert (tmp_path / "results.csv").read_bytes() == data


def _finished_run(tmp_path: Path, cfg: dict, gpu: str | None) -> dict:
    """One finished run of a one-cell study, its config.yaml ``cfg`` on top of what train.py
    writes, on ``gpu`` (None: a CPU); its ledger row (study.results.collect)."""
    from study.plan import Plan
    from study.results import collect, write_csv
    from study.state import Study

    plan = Plan(out=tmp_path, optimizers=["adamw"], models=["proxy-100k"], budgets=[0.25],
                baseline_budgets=[], knobs=["lr"])  # fmt: skip
    study = Study(plan)
    run = study.update(plan.cells()[0]).pending[0]
    ov = dict(o.split("=", 1) for o in run.overrides)
    run.out_dir.mkdir(parents=True)
    full = {"max_steps": run.max_steps, "batch_tokens": int(ov["batch_tokens"]),
            "seed": int(ov["seed"]), "data": {}, "optimizer": {"lr": float(ov["optimizer.lr"]),
            "weight_decay": 0.1}, "schedule": {"warmup_steps": 3, "min_lr_ratio": 0.1}, **cfg}  # fmt: skip
    (run.out_dir / "config.yaml").write_text(yaml.safe_dump(full))
    (run.out_dir / "summary.json").write_text(json.dumps({"steps": run.max_steps,
        "final_val_loss": 2.0, "best_val_loss": 2.0, "tokens": 1000, "elapsed_s": 1.0}))  # fmt: skip
    meta = {
        "git_commit": "abc",
        "argv": ["train.py", *run.overrides],
        **({"gpu": gpu} if gpu else {}),
    }
    (run.out_dir / "meta.jsonl").write_text(json.dumps(meta) + "\n")
    rows, _ = collect(study)
    assert len(rows) == 1
    write_csv(rows, tmp_path / "results.csv")
    return ledger.read_raw(tmp_path / "results.csv")[0]


@pytest.mark.parametrize(
    ("cfg", "gpu", "want"),
    [
        ({"dtype": "auto", "tf32": True}, "NVIDIA H100", ("bfloat16", "1")),
        ({"dtype": "float32", "tf32": True}, "NVIDIA H100", ("float32", "1")),
        ({"dtype": "float32", "tf32": False}, "NVIDIA H100", ("float32", "0")),
        ({"dtype": "auto"}, None, ("float32", "")),  # a CPU run from before the key
        ({"dtype": "auto", "tf32": True}, None, ("float32", "1")),  # as its config says
        ({"dtype": "bfloat16"}, None, ("bfloat16", "")),
        ({"dtype": "auto"}, "NVIDIA H100", ("bfloat16", "")),  # a GPU run from before the key
    ],
)
def test_a_rows_dtype_and_tf32_are_the_runs(tmp_path, cfg, gpu, want):
    """Issue 64: the ledger row's dtype and tf32 are the run's, read from its own config.yaml
    (tf32 blank where the config has no such key) on the device it ran on; columns before the
    command, read back as written."""
    row = _finished_run(tmp_path, cfg, gpu)
    assert (row["dtype"], row["tf32"]) == want
    head = (tmp_path / "results.csv").read_text().split("\n")[0]
    assert head.endswith(("dtype,tf32,command", "device,dtype,tf32,command"))
    assert row.get("device", "") == (gpu or "")
