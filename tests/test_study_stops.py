"""The study stops on what is not divergence (issue 66): a bad ``--set``, ``--device`` or
``--runs`` is one line before anything is scheduled (in --dry-run too); a run whose command fails
with a config, data or file error stops the study with one line (the run, the reason from its
output, the command that runs it alone); a run that failed the same way twice is never launched
a third time; a dry run writes nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from study import cli, parts, runner, scheduler

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--optimizers", "adamw", "--budgets", "0.25", "--baseline-budgets", "--knobs", "lr",
         "--select-seeds", "0", "--eval-seeds", "1", "2", "--allow-dirty", "--jobs", "1"]  # fmt: skip


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value.code)
    assert "\n" not in text and exc.value.code != 0, text
    return text


def _no_launch(monkeypatch: pytest.MonkeyPatch) -> list:
    launched: list = []
    monkeypatch.setattr(scheduler, "launch_each", lambda *a, **k: launched.append(a) or (0, ""))
    return launched


BAD_SET = [
    (["--set", "nosuchkey=1"], "unknown config key nosuchkey"),
    (["--set", "max_steps=abc"], "max_steps: Value 'abc'"),
    (["--set", "novalue"], "--set 'novalue': write KEY=VALUE"),
    (["--set", "optimizer.lr=-1"], "optimizer.lr must be > 0"),
    (["--device", "tpu"], "--device tpu: one of auto, cpu, cuda, mps"),
]


@pytest.mark.parametrize("dry", [False, True])
@pytest.mark.parametrize(("argv", "line"), BAD_SET)
def test_a_bad_set_or_device_is_one_line_before_anything_runs(monkeypatch, capsys, argv, line,
                                                               dry):  # fmt: skip
    """The looping ``--set nosuchkey=1`` of the issue: refused in one line, nothing launched,
    nothing restored or written, with --dry-run as without."""
    launched = _no_launch(monkeypatch)
    restored: list = []
    monkeypatch.setattr(parts, "restore", lambda *a, **k: restored.append(a))
    with pytest.raises(SystemExit) as exc:
        parts.main(["run", "crossover", "--part", "b524288", "--jobs", "1", *argv,
                    *(["--dry-run"] if dry else [])])  # fmt: skip
    text = (
        _one_line(exc) if exc.value.code != 2 else capsys.readouterr().err.strip().splitlines()[-1]
    )
    assert line in text, text
    assert launched == [] and restored == []


def test_runs_that_is_a_file_is_one_line(tmp_path, capsys):
    f = tmp_path / "runs.txt"
    f.write_text("x\n")
    with pytest.raises(SystemExit) as exc:
        parts.main(["run", "crossover", "--runs", str(f), "--dry-run"])
    assert exc.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"--runs {f}: a file, not a folder" in last


def test_a_bad_override_in_the_study_command_is_refused_before_its_folder(tmp_path, monkeypatch):
    launched = _no_launch(monkeypatch)
    out = tmp_path / "s"
    for extra in (["--", "nosuchkey=1"], ["--device", "tpu"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(["--out", str(out), *SMALL, *extra])
        text = _one_line(exc)
        assert text.startswith("study: adamw's runs would be refused by train.py: config error")
    assert launched == [] and not out.exists()


def test_a_run_that_fails_with_a_config_error_stops_the_study_at_once(tmp_path, monkeypatch):
    """One launch, then one line: the run, the reason its output gave, the command alone."""
    calls: list = []

    def fails(cmds, **kw):  # noqa: ANN001, ANN003, ANN202
        calls.append(cmds[0])
        return 1, "12:00:00 composing\nconfig error: data.dir /nope: no such folder\n"

    monkeypatch.setattr(scheduler, "launch_each", fails)
    out = tmp_path / "s"
    with pytest.raises(SystemExit) as exc:
        cli.main(["--out", str(out), *SMALL])
    text = _one_line(exc)
    assert len(calls) == 1
    assert text.startswith("study: run runs/proxy-100k/0.25x/adamw/select/")
    assert "failed (exit 1): config error: data.dir /nope: no such folder" in text
    assert "train.py" in text and "experiment=study" in text and str(out / "train.log") in text
    assert not list(out.rglob("study_failed.json"))  # not counted as a divergence


def test_a_part_names_itself_in_the_line(tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "run", lambda plan, argv=None: (_ for _ in ()).throw(
        scheduler.RunFailed("study: run runs/x failed (exit 1): data error: short")))  # fmt: skip
    part = parts.Part("t", "p", {}, tmp_path / "r", tmp_path / "res")
    d = parts.Definition("t", {"p": part}, ["p"], {}, [])
    with pytest.raises(SystemExit, match=r"^study: part p: run runs/x failed \(exit 1\)"):
        parts.run_part(part, d, {}, False)


def test_a_run_that_fails_twice_the_same_way_is_not_launched_a_third_time(tmp_path, monkeypatch):
    """A command killed (a signal: not the run's error) before its run directory: relaunched
    once, then the study stops, naming the run and why."""
    calls: list = []

    def killed(cmds, **kw):  # noqa: ANN001, ANN003, ANN202
        calls.append(cmds[0])
        return -9, ""

    monkeypatch.setattr(scheduler, "launch_each", killed)
    with pytest.raises(SystemExit) as exc:
        cli.main(["--out", str(tmp_path / "s"), *SMALL])
    text = _one_line(exc)
    assert len(calls) == 2 and calls[0] == calls[1]
    assert "failed (exit -9): it printed nothing (twice: not launched a third time)" in text


def test_a_diverged_run_counts_as_diverged_and_the_study_goes_on(tmp_path, monkeypatch):
    """A command that exits 1 after recording a divergence (summary.json ``stopped: diverged``)
    is the old path: its run is diverged, the grid moves on, the study does not stop."""
    calls: list = []

    def diverges(cmds, **kw):  # noqa: ANN001, ANN003, ANN202
        out_dir = Path(next(a for a in cmds[0] if a.startswith("out_dir="))[8:])
        out_dir.mkdir(parents=True)
        (out_dir / "summary.json").write_text(json.dumps({"stopped": "diverged", "steps": 3}))
        calls.append(out_dir)
        return 1, "non-finite loss 3 steps in a row: diverged"

    monkeypatch.setattr(scheduler, "launch_each", diverges)
    monkeypatch.setattr(cli, "write_report", lambda *a, **k: None, raising=False)
    import study.report

    monkeypatch.setattr(study.report, "write_report", lambda *a, **k: None)
    assert cli.main(["--out", str(tmp_path / "s"), *SMALL]) == 0
    assert len(calls) == len(set(calls)) > 1  # every run once, none relaunched


def test_failure_reason_is_the_last_line_that_says_something():
    assert runner.failure_reason("a\n12:00:01 config error: x\n\n") == "config error: x"
    tb = "Traceback (most recent call last):\n  File x\n    ^^^^\nValueError: bad shard\n"
    assert runner.failure_reason(tb) == "ValueError: bad shard"
    assert runner.failure_reason("") == "it printed nothing"


def test_a_dry_run_writes_nothing_and_reads_the_published_ledger(tmp_path, caplog):
    """``run --dry-run`` of a part whose run tree is gone: nothing copied into runs/, nothing
    written anywhere; the published ledger is read where it is, so a complete part says so."""
    import logging

    root = tmp_path / "root"
    pub = root / "results" / "t" / "p"
    pub.mkdir(parents=True)
    src = ROOT / "results" / "crossover" / "b2048"
    for name in ("results.csv", "curves.csv.gz", "started.txt"):
        shutil.copy(src / name, pub / name)
    (root / "t.yaml").write_text(
        'study: t\ndefaults:\n  optimizers: [adamw, mars-adamw, "mars-adamw:gamma=0"]\n'
        "  models: [proxy-100k]\n  baseline_budgets: []\n  knobs: [lr]\n  swap: false\n"
        "  center_from: referee/batch@proxy-100k:1\n"
        "parts:\n  p: {budgets: [1], batch_tokens: 2048}\n"
    )
    (root / "results" / "referee" / "batch").mkdir(parents=True)
    shutil.copy(ROOT / "results/referee/batch/results.csv", root / "results/referee/batch")
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    with caplog.at_level(logging.INFO, logger="study"):
        assert parts.main(["run", str(root / "t.yaml"), "--dry-run"], root=root) == 0
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
    assert "complete, nothing to run" in caplog.text
    assert "+ " not in caplog.text  # no command printed: every run is in the ledger
