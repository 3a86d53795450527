"""One line where a traceback or a loss was (issue 66): eval.py keeps its finished tasks on
SIGTERM (Slurm's time limit) as it does on Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from test_eval import run_eval, task_dir, tiny_run  # noqa: F401  (fixtures)

import eval as eval_py


def test_sigterm_keeps_the_tasks_done_as_partial(tiny_run, task_dir, tmp_path, monkeypatch,  # noqa: F811
                                                 capfd):  # fmt: skip
    real = eval_py.run_task

    def terminated_in_hellaswag(name, *args):  # noqa: ANN001, ANN002, ANN202
        if name == "hellaswag":
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises at once, here
        return real(name, *args)

    monkeypatch.setattr(eval_py, "run_task", terminated_in_hellaswag)
    before = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "r.json"
    with pytest.raises(SystemExit) as info:
        run_eval(f"checkpoint={tiny_run}", "tasks=[val,hellaswag]", f"data_dir={task_dir}",
                 f"out={out}")  # fmt: skip
    assert info.value.code == 143  # 128 + SIGTERM, as a shell reports it
    assert signal.getsignal(signal.SIGTERM) == before  # the caller's handler is back
    saved = json.loads(out.read_text())
    assert saved["partial"] is True and saved["interrupted"] == "hellaswag"
    assert set(saved["results"]) == {"val"} and saved["results"]["val"]["loss"] > 0
    err = capfd.readouterr().err.strip().splitlines()
    assert err[-1] == (f"interrupted (SIGTERM) during hellaswag: val written to {out} (marked "
                       "partial); run the same command again for the rest (tasks=[hellaswag] "
                       "scores only it, limit=N fewer rows)")  # fmt: skip


@pytest.mark.parametrize("name", ["../../x", "/tmp/x", "a/../../b"])
def test_a_run_name_cannot_leave_runs(name):
    from types import SimpleNamespace

    from trainer.command_line import default_run_dir
    from trainer.rundir import run_dir_name

    with pytest.raises(ValueError, match="a run's name is a path inside runs/"):
        run_dir_name(name, [])
    cfg = SimpleNamespace(name=name, optimizer=SimpleNamespace(name="adamw"))
    with pytest.raises(SystemExit) as info:
        default_run_dir(cfg)
    assert str(info.value.code).startswith(f"config error: name={name}: ")
    assert "\n" not in str(info.value.code)
    assert run_dir_name("owt/small-adamw", []) == "runs/owt/small-adamw"  # a folder inside: fine


def test_a_negative_seed_is_a_config_error_before_any_file(tmp_path):
    """seed=-1 was 64 lines of traceback after the run directory was written."""
    import subprocess

    from runtime.commands import train_command

    out = tmp_path / "run"
    cmd = train_command(["seed=-1", f"out_dir={out}", "max_steps=1"])
    done = subprocess.run(cmd, cwd=Path(__file__).resolve().parent.parent, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0
    assert lines[-1] == "config error: seed must be a whole number >= 0, got -1", done.stderr[
        -2000:
    ]
    assert not out.exists()


def test_convert_names_a_file_checkpoint_as_one_not_an_unfinished_save(tmp_path, capsys):
    from scripts.convert_checkpoint import main as convert

    f = tmp_path / "step_0000002.pt"
    f.write_bytes(b"PK\x03\x04 a file checkpoint")
    with pytest.raises(SystemExit) as info:
        convert([str(f)])
    text = str(info.value.code)
    assert "is a file checkpoint already" in text and "did not finish" not in text
    assert "\n" not in text and not (tmp_path / "step_0000002.pt.pt").exists()
    with pytest.raises(SystemExit, match="no such checkpoint"):
        convert([str(tmp_path / "nope")])
    with pytest.raises(SystemExit) as usage:
        convert([])
    assert usage.value.code == 2
    assert "usage: python -m scripts.convert_checkpoint" in capsys.readouterr().err


def test_export_onto_an_existing_file_is_one_line_and_the_file_is_kept(tmp_path):
    from scripts.export_hf import main as export_hf

    f = tmp_path / "out"
    f.write_text("mine\n")
    with pytest.raises(SystemExit) as info:
        export_hf([str(tmp_path / "nope"), str(f)])
    assert str(info.value.code) == (f"error: {f} is a file: name a directory to write the "
                                    "export into (new, or one to overwrite)")  # fmt: skip
    assert f.read_text() == "mine\n"


def test_ctrl_c_in_sample_is_one_line(tmp_path, monkeypatch, capsys):
    import scripts.sample as sample

    def interrupted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise KeyboardInterrupt

    monkeypatch.setattr(sample, "load_model", interrupted)
    with pytest.raises(SystemExit) as info:
        sample.main([str(tmp_path), "--device", "cpu"])
    assert info.value.code == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["interrupted (Ctrl-C): no sample printed, nothing written"]
