"""study.rerun: a committed run reproduced (or not) at this checkout, without training: the
train.py command is replaced by one that writes a planted summary."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from study import rerun


def finished_run(tmp_path, name="lr-0.008_seed-1", val=1.805145784993253, train=1.9):
    d = tmp_path / "runs" / name
    d.mkdir(parents=True)
    argv = [
        "train.py",
        "experiment=study",
        "optimizer=adamw",
        "seed=1",
        f"out_dir=/elsewhere/{name}",
    ]
    (d / "meta.jsonl").write_text(
        json.dumps({"argv": argv, "git_commit": "b85160a" + "0" * 33}) + "\n"
    )
    (d / "summary.json").write_text(json.dumps({"final_val_loss": val, "final_train_loss": train}))
    return d


def fake_train(monkeypatch, val, train=1.9, seen=None):
    """subprocess.run for train.py: writes a summary into the command's out_dir."""
    real = subprocess.run

    def run(cmd, **kw):
        if "train.py" not in cmd:
            return real(cmd, **kw)
        if seen is not None:
            seen.append((cmd, kw.get("env", {}).get("OMP_NUM_THREADS")))
        out = next(a.split("=", 1)[1] for a in cmd if a.startswith("out_dir="))
        from pathlib import Path

        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "summary.json").write_text(
            json.dumps({"final_val_loss": val, "final_train_loss": train})
        )
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(rerun.subprocess, "run", run)


def test_equal_losses_reproduce_and_the_command_is_the_recorded_one(tmp_path, monkeypatch, capsys):
    d = finished_run(tmp_path)
    seen = []
    fake_train(monkeypatch, 1.805145784993253, seen=seen)
    assert rerun.main([str(d), "--threads", "3", "--keep", str(tmp_path / "again")]) == 0
    ((cmd, threads),) = seen
    assert cmd[-5:-1] == ["train.py", "experiment=study", "optimizer=adamw", "seed=1"]
    assert cmd[-1] == f"out_dir={tmp_path / 'again' / d.name}"  # never the run's own folder
    assert threads == "3"
    assert "1 of 1 reproduced bit for bit" in capsys.readouterr().out
    assert json.loads((d / "summary.json").read_text())["final_val_loss"] == 1.805145784993253


def test_one_ulp_is_a_difference(tmp_path, monkeypatch, capsys):
    d = finished_run(tmp_path)
    fake_train(monkeypatch, 1.8051457849932532)  # the next float up
    assert rerun.main([str(d)]) == 1
    out = capsys.readouterr().out
    assert "DIFFERS" in out and "final_val_loss" in out and "0 of 1" in out


def test_bad_input_is_refused_before_any_run(tmp_path, monkeypatch, capsys):
    good = finished_run(tmp_path)
    seen = []
    fake_train(monkeypatch, 1.0, seen=seen)
    assert rerun.main([str(good), str(tmp_path / "missing")]) == 2
    assert "has no meta.jsonl" in capsys.readouterr().err and not seen
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    assert rerun.main([str(good), "--keep", str(tmp_path / "full")]) == 2
    assert "not empty" in capsys.readouterr().err and not seen


def test_a_failed_rerun_is_reported_not_raised(tmp_path, monkeypatch, capsys):
    d = finished_run(tmp_path)
    monkeypatch.setattr(rerun.subprocess, "run",
                        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 3, "", "boom"))  # fmt: skip
    assert rerun.main([str(d)]) == 1
    assert "the rerun failed (exit 3): boom" in capsys.readouterr().out


@pytest.mark.parametrize("old,new,equal", [
    ({"final_val_loss": 1.0, "final_train_loss": 2.0}, {"final_val_loss": 1.0, "final_train_loss": 2.0}, True),
    ({"final_val_loss": 1.0, "final_train_loss": 2.0}, {"final_val_loss": 1.0, "final_train_loss": 2.5}, False),
    ({"final_val_loss": 1.0}, {}, False),
])  # fmt: skip
def test_compare(old, new, equal):
    assert rerun.compare(old, new)[0] is equal


def test_module_runs_as_a_command():
    out = subprocess.run([sys.executable, "-m", "study", "rerun", "--help"], capture_output=True,
                         text=True, cwd=rerun.ROOT)  # fmt: skip
    assert out.returncode == 0 and "--threads" in out.stdout


def test_a_multi_process_run_is_refused(tmp_path, capsys):
    d = finished_run(tmp_path)
    meta = json.loads((d / "meta.jsonl").read_text())
    (d / "meta.jsonl").write_text(json.dumps({**meta, "world_size": 8}) + "\n")
    assert rerun.main([str(d)]) == 2
    assert "ran on 8 processes" in capsys.readouterr().err


def test_a_difference_on_another_cpu_kind_says_so(tmp_path, monkeypatch, capsys):
    """Bit for bit holds on the run's own CPU kind and vector-kernel level: a run recorded on
    another kind (or without its level) that differs is reported with both; on the same kind and
    level the difference stands alone. A recorded level is the rerun's (ATEN_CPU_CAPABILITY),
    and --record keeps one JSON line per rerun."""
    from runtime.runfiles import cpu_capability, cpu_name

    here = {"cpu": cpu_name(), "cpu_capability": cpu_capability()}
    cases = (({"cpu": "Intel(R) Xeon(R) Processor"}, True), ({"cpu": cpu_name()}, True),
             (here, False))  # fmt: skip
    for i, (recorded, named) in enumerate(cases):
        d = finished_run(tmp_path / str(i))
        meta = json.loads((d / "meta.jsonl").read_text())
        (d / "meta.jsonl").write_text(json.dumps({**meta, **recorded}) + "\n")
        record = tmp_path / f"record-{i}.jsonl"
        fake_train(monkeypatch, 1.8051457849932532)
        from study import results

        monkeypatch.setattr(rerun, "recorded_cpu", lambda r: results._cpu(r))
        assert rerun.main([str(d), "--record", str(record)]) == 1
        out = capsys.readouterr().out
        assert ("need not agree to the last bit" in out) is named, out
        assert f"on {cpu_name()}" in out.splitlines()[0]
        row = json.loads(record.read_text())
        assert row["old"] == 1.805145784993253 and row["val_loss"] == 1.8051457849932532
        assert row["equal"] is False and row["command"][0] == "experiment=study"
    assert (
        rerun.capability_of("AMD EPYC (AVX2)") == "AVX2" and rerun.capability_of("AMD EPYC") is None
    )
    d = finished_run(tmp_path / "avx2")
    meta = json.loads((d / "meta.jsonl").read_text())
    (d / "meta.jsonl").write_text(
        json.dumps({**meta, "cpu": "AMD EPYC", "cpu_capability": "AVX2"}) + "\n"
    )
    fake_train(monkeypatch, 1.805145784993253)
    inner, levels = rerun.subprocess.run, []

    def spy(cmd, **kw):
        if "train.py" in cmd:
            levels.append(kw["env"].get("ATEN_CPU_CAPABILITY"))
        return inner(cmd, **kw)

    monkeypatch.setattr(rerun.subprocess, "run", spy)
    assert rerun.main([str(d)]) == 0 and levels == ["avx2"]  # the recorded level, not this one's
    capsys.readouterr()


def test_runs_record_their_cpu(tmp_path):
    from runtime import runfiles
    from runtime.runfiles import cpu_name
    from trainer.rundir import write_run_files

    write_run_files(tmp_path, {"seed": 1}, {})
    meta = runfiles.read_meta(tmp_path)[0]
    assert meta["cpu"] == cpu_name() != "" and meta["cpu_capability"] == runfiles.cpu_capability()
    from study import results

    assert results._cpu(tmp_path) == f"{cpu_name()} ({runfiles.cpu_capability()})"
