"""The study command's one-line refusals, its stop on SIGTERM/Ctrl-C, and its PARTIAL report
(issue: every failure in one line, the run tree untouched)."""

import logging
import subprocess
import sys

import pytest

from study import runner
from study.cli import main

BAD = [
    (["--budgets", "-1"], "--budgets -1: budgets are positive"),
    (["--budgets", "0"], "--budgets 0: budgets are positive"),
    (["--budgets", "nan"], "--budgets nan: budgets are positive"),
    (["--baseline-budgets", "0"], "--baseline-budgets 0"),
    (["--jobs", "0"], "--jobs 0: at least 1"),
    (["--jobs", "-3"], "--jobs -3: at least 1"),
    (["--threads", "0"], "--threads 0: at least 1"),
    (["--batch-tokens", "-5"], "--batch-tokens -5: at least 1"),
    (["--collapse-floor", "nan"], "--collapse-floor nan: a finite loss"),
    (["--models", "nope"], "unknown model 'nope'"),
    (["--reference-budgets", "2"], "--reference-budgets is now --baseline-budgets"),  # renamed
]


@pytest.mark.parametrize(("argv", "line"), BAD)
def test_a_bad_value_is_one_line_before_anything_is_written(tmp_path, argv, line):
    out = tmp_path / "s"
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(out), "--optimizers", "adamw", *argv])
    text = str(exc.value)
    assert text.startswith("study: ") and line in text and "\n" not in text
    assert not out.exists()


def test_an_out_that_is_a_file_and_a_merge_that_is_not_a_ledger_are_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("x\n")
    with pytest.raises(SystemExit, match="a file is there"):
        main(["--out", str(f), "--optimizers", "adamw"])
    with pytest.raises(SystemExit, match="not a study's results.csv"):
        main(["--out", str(tmp_path / "s"), "--optimizers", "adamw", "--merge", str(f)])


def test_a_stop_asks_every_running_command_to_checkpoint_and_names_the_continuing_command():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    runner.LIVE.add(proc)
    try:
        from study.cli import parse, plan_of, stopped_line
        from study.state import Study

        argv = ["--out", "/nonexistent/s", "--optimizers", "adamw", "--budgets", "0.25"]
        study = Study(plan_of(*parse(argv)))
        line = stopped_line(study, argv)
        assert proc.wait(timeout=10) != 0  # it was sent SIGTERM
        assert "1 run(s) in flight asked to checkpoint" in line and "\n" not in line
        assert line.endswith(
            "python -m study --out /nonexistent/s --optimizers adamw --budgets 0.25"
        )
    finally:
        runner.LIVE.discard(proc)
        if proc.poll() is None:
            proc.kill()


def test_a_stop_during_scheduling_counts_the_runs_it_asked_to_checkpoint(monkeypatch):
    """The scheduler's own stop asks the runs first and the pool waits for them, so by the time
    the closing line is written none is live: it still says how many were asked."""
    import argparse

    from study import scheduler
    from study.cli import parse, plan_of, stopped_line
    from study.state import Study

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    def interrupted(study, args, pool, running):  # noqa: ANN001, ANN202
        runner.LIVE.add(proc)
        raise KeyboardInterrupt

    monkeypatch.setattr(scheduler, "_keep_running", interrupted)
    argv = ["--out", "/nonexistent/s", "--optimizers", "adamw", "--budgets", "0.25"]
    study = Study(plan_of(*parse(argv)))
    try:
        with pytest.raises(KeyboardInterrupt):
            scheduler.schedule(study, argparse.Namespace(jobs=2))
        assert proc.wait(timeout=10) != 0  # it was sent SIGTERM
        runner.LIVE.discard(proc)  # as execute does when its process ends
        assert "1 run(s) in flight asked to checkpoint" in stopped_line(study, argv)
    finally:
        runner.LIVE.discard(proc)
        if proc.poll() is None:
            proc.kill()


def test_report_only_on_an_unfinished_study_says_partial(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="study")
    assert main(["--out", str(tmp_path / "s"), "--optimizers", "adamw", "--budgets", "0.25",
                 "--baseline-budgets", "--report-only"]) == 0  # fmt: skip
    msgs = [r.getMessage() for r in caplog.records]
    assert any("PARTIAL" in m and "continues them" in m for m in msgs)
    assert not any(m.startswith("study done") for m in msgs)


def test_a_renamed_definition_key_is_refused_with_its_new_name(tmp_path):
    """``reference_budgets`` (a definition's key before ``reference`` kept one meaning, MARS's
    reference gradient) is refused in one line naming ``baseline_budgets``."""
    from study import definition as defs

    path = tmp_path / "s.yaml"
    path.write_text("study: s\ndefaults: {reference_budgets: []}\nparts: {a: {budgets: [1]}}\n")
    with pytest.raises(defs.DefinitionError, match="a: reference_budgets is now baseline_budgets"):
        defs.load(str(path))


def test_main_in_another_program_gives_back_its_sigterm_handler(tmp_path):
    """A study run inside another program (a test runner, a notebook) installs its stop handler
    only while it schedules: the caller's handler is back afterwards, so the caller's later forks
    (a tokenizer pool) do not turn a SIGTERM into a KeyboardInterrupt."""
    import signal

    mine = signal.getsignal(signal.SIGTERM)
    assert main(["--out", str(tmp_path / "s"), "--optimizers", "adamw", "--budgets", "0.25",
                 "--baseline-budgets", "--dry-run", "--allow-dirty"]) == 0  # fmt: skip
    assert signal.getsignal(signal.SIGTERM) is mine


def test_one_door_every_subcommand_a_main_and_no_module_its_own_entry(capsys):
    """``python -m study <subcommand>`` is the one door (study/__main__.py's SUBCOMMANDS): each
    row names a module with a ``main(argv)``; no other study module keeps its own
    ``if __name__ == "__main__":``; ``help`` lists every name and an unknown one gets one line
    naming the valid ones; no page or test spells the old door (the module after a dot)."""
    import importlib
    from pathlib import Path

    from study.__main__ import SUBCOMMANDS
    from study.__main__ import main as door

    root = Path(__file__).resolve().parent.parent
    for name, (module, text) in SUBCOMMANDS.items():
        assert callable(importlib.import_module(module).main), name
        assert text and "\n" not in text, name
    own = [p.name for p in (root / "study").glob("*.py")
           if p.name != "__main__.py" and 'if __name__ == "__main__"' in p.read_text()]  # fmt: skip
    assert own == [], f"{own}: a second door; add a row to study/__main__.py's SUBCOMMANDS"
    assert door(["help"]) == 0
    listed = capsys.readouterr().out
    assert all(f"  {name} " in listed for name in SUBCOMMANDS)
    assert door(["nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and all(name in err[0] for name in SUBCOMMANDS), err
    old = "python -m study" + "."  # the old spelling, not written whole so this file passes
    texts = [root / "README.md", *(root / "docs").rglob("*.md"), *(root / "study").rglob("*.py"),
             *(root / "study").rglob("*.yaml"), *(root / "tests").glob("*.py"),
             *(root / "scripts").rglob("*.py"), *(root / "results").rglob("*.md")]  # fmt: skip
    stale = [str(p.relative_to(root)) for p in texts if old in p.read_text()]
    assert stale == [], f"{stale}: the old door's spelling; use python -m study <subcommand>"


def test_the_door_spawns_a_subcommand_and_the_flag_command():
    """The door as a reader types it: a subcommand's own --help, and the flag command's."""
    out = subprocess.run([sys.executable, "-m", "study", "family", "--help"], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0 and "python -m study family" in out.stdout, out.stderr
    out = subprocess.run([sys.executable, "-m", "study", "--out", "x", "--help"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0 and "--optimizers" in out.stdout, out.stderr
