"""Runs that survive clusters (docs/failures.md): stop on SIGTERM/SIGUSR1 with a checkpoint and
the requeue status, torchrun restarts into the same run directory, kills at any moment, unwritable
checkpoints, relaunched finished runs, and file permissions. Resumed runs equal uninterrupted ones
bit for bit."""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import train
import trainer.trainer as trainer_mod
from helpers import FAST, ROOT, fast_config
from trainer import checkpoint as ckpt
from trainer.preemption import REQUEUE_EXIT_CODE, Preempted

# Timings, and the clip rate, which counts the steps of the current session only.
DROP = ("tokens_per_s", "elapsed_s", "mfu", "eta_s", "clip_rate")


def numbers(out_dir: Path) -> list[dict]:
    """metrics.jsonl without its timings."""
    lines = (out_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(ln).items() if k not in DROP} for ln in lines]


def run(out_dir, data_dir, *overrides):
    typed, plain = fast_config(out_dir, data_dir, *overrides)
    return train.train(typed, plain)


def signal_at_step(monkeypatch, step: int, sig: signal.Signals) -> None:
    """Make this process receive ``sig`` during step ``step`` (as a cluster would)."""
    original = trainer_mod.Trainer.train_step

    def train_step(self):
        if self.state.step + 1 == step:
            os.kill(os.getpid(), sig)
        return original(self)

    monkeypatch.setattr(trainer_mod.Trainer, "train_step", train_step)


COMMON = ("schedule.decay_steps=6", "model.dropout=0.1", "eval_every=0", "max_steps=6")


@pytest.fixture(scope="module")
def straight(tmp_path_factory, sotu_dir) -> Path:
    out = tmp_path_factory.mktemp("straight") / "run"
    run(out, sotu_dir, *COMMON)
    return out


def test_signal_stops_with_checkpoint_and_resume_is_exact(
    tmp_path, sotu_dir, straight, monkeypatch
):
    sig = signal.SIGUSR1  # SIGTERM: the torchrun test below
    out = tmp_path / "run"
    signal_at_step(monkeypatch, 3, sig)
    with pytest.raises(Preempted) as info:
        run(out, sotu_dir, *COMMON)
    assert info.value.code == REQUEUE_EXIT_CODE and info.value.step == 3
    assert f"stopped on {sig.name} at step 3" in str(info.value)
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["step_0000003.pt"]
    assert not (out / "summary.json").exists()  # not finished
    assert signal.getsignal(sig) is signal.SIG_DFL  # the handlers are put back
    monkeypatch.undo()
    run(out, sotu_dir, *COMMON)  # the same command again
    assert numbers(out)[-1]["step"] == 6
    assert numbers(out) == numbers(straight)


def test_corrupt_newest_checkpoint_falls_back_and_leftovers_go(
    tmp_path, sotu_dir, straight, capsys
):
    out = tmp_path / "run"
    run(out, sotu_dir, *COMMON, "ckpt_every=2", "keep_checkpoints=0")
    newest = out / "checkpoints" / "step_0000006.pt"
    newest.write_bytes(newest.read_bytes()[:1000])  # truncated, as by a full disk elsewhere
    leftover = out / "checkpoints" / ".step_0000007.pt.x1y2.tmp"  # a writer killed midway
    leftover.write_bytes(b"partial")
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "train_lo')  # a line cut by a kill
    summary = run(out, sotu_dir, *COMMON, "ckpt_every=2", "keep_checkpoints=0")
    printed = capsys.readouterr().out
    assert "falling back to the previous checkpoint" in printed
    assert str(newest) in printed and "step_0000004.pt" in printed
    assert not leftover.exists()
    assert ckpt.load_checkpoint(newest)["step"] == 6  # rewritten whole
    assert numbers(out) == numbers(straight)
    assert summary["final_val_loss"] == numbers(straight)[-1]["val_loss"]


def test_summary_of_a_run_killed_after_its_last_checkpoint(tmp_path, sotu_dir):
    out = tmp_path / "run"
    first = run(out, sotu_dir, "max_steps=2")
    (out / "summary.json").unlink()  # killed between the final checkpoint and the summary
    again = run(out, sotu_dir, "max_steps=2")
    for key in ("final_train_loss", "final_val_loss", "best_val_loss", "steps", "tokens"):
        assert again[key] == first[key] is not None, key


def _unwritable(tmp_path, sotu_dir, monkeypatch, inject) -> tuple[Path, str]:
    out = tmp_path / "run"
    run(out, sotu_dir, "max_steps=4", "ckpt_every=2", "keep_checkpoints=1")
    intact = (out / "checkpoints" / "step_0000004.pt").read_bytes()
    inject(out)
    with pytest.raises(SystemExit) as info:
        run(out, sotu_dir, "max_steps=6", "ckpt_every=2", "keep_checkpoints=1")
    monkeypatch.undo()
    d = out / "checkpoints"
    assert sorted(p.name for p in d.iterdir()) == [
        "step_0000004.pt",
        "step_0000004.pt.sha256",
    ]  # no temporary file left
    assert (d / "step_0000004.pt").read_bytes() == intact
    message = str(info.value.code)
    assert str(d / "step_0000005.pt") not in message and str(d / "step_0000006.pt") in message
    assert "step_0000004.pt" in message and "run the same command again" in message
    return out, message


def test_checkpoint_on_a_full_disk(tmp_path, sotu_dir, monkeypatch):
    def inject(_):
        def full(obj, f):
            f.write(b"x" * 4096)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(ckpt.torch, "save", full)

    _, message = _unwritable(tmp_path, sotu_dir, monkeypatch, inject)
    assert "No space left on device" in message and "Free disk space" in message


def test_checkpoint_into_a_read_only_directory(tmp_path, sotu_dir, monkeypatch):
    def inject(out):
        if os.geteuid() == 0:  # root ignores permissions: fail as the kernel would for a user
            real = tempfile.mkstemp

            def denied(*args, dir=None, **kwargs):
                if Path(dir).name == "checkpoints":
                    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
                return real(*args, dir=dir, **kwargs)

            monkeypatch.setattr(tempfile, "mkstemp", denied)
        else:
            (out / "checkpoints").chmod(0o555)

    try:
        _, message = _unwritable(tmp_path, sotu_dir, monkeypatch, inject)
    finally:
        (tmp_path / "run" / "checkpoints").chmod(0o755)
    assert "Permission denied" in message and "permissions" in message


def test_files_get_the_umask_permissions(tmp_path, sotu_dir):
    from model import GPT
    from model.hf import save_hf

    old = os.umask(0o027)
    try:
        out = tmp_path / "run"
        run(out, sotu_dir, "max_steps=1")
        typed, _ = fast_config(out, sotu_dir)
        model = GPT(typed.model)
        save_hf(model, tmp_path / "hf")
    finally:
        os.umask(old)
    files = [
        *ckpt.list_checkpoints(out),
        *(out / n for n in ("config.yaml", "summary.json", "metrics.jsonl", "meta.jsonl")),
        tmp_path / "hf" / "model.safetensors",
        tmp_path / "hf" / "config.json",
    ]
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in files}
    assert set(modes.values()) == {oct(0o640)}, modes


# --- real torchrun runs: 2 gloo processes ------------------------------------------------------

SLOW_TRAIN = """
import sys, time
sys.path.insert(0, {root!r})
import trainer.preemption as p
original = p.PreemptionGuard.stop_requested
def slow(self):  # about 0.15 s per step, so that a test can act mid-run
    time.sleep(0.15)
    return original(self)
p.PreemptionGuard.stop_requested = slow
import train
from trainer.command_line import cli
cli(train.train)
"""
OVERRIDES = [*COMMON[1:3], "max_steps=10", "schedule.decay_steps=10"]


def torchrun(cwd: Path, *args: str, restarts: int = 0) -> subprocess.Popen:
    """``torchrun --standalone --nproc_per_node=2 train.py`` (slowed down), in its own session."""
    script = cwd / "slow_train.py"
    script.write_text(SLOW_TRAIN.format(root=str(ROOT)))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           f"--max-restarts={restarts}", str(script), *FAST, *OVERRIDES, *args]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip


def finish(proc: subprocess.Popen) -> str:
    return proc.communicate(timeout=120)[0]


def wait_for_step(pattern: str, cwd: Path, step: int, proc: subprocess.Popen) -> None:
    """Wait until a ``metrics.jsonl`` matching ``pattern`` under ``cwd`` holds ``step``."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        for path in cwd.glob(pattern):
            lines = path.read_text().splitlines()[:-1]  # the last one may be half written
            if any(json.loads(ln)["step"] >= step for ln in lines):
                return
        time.sleep(0.02)
    raise AssertionError(f"never saw step {step}:\n{finish(proc)[-4000:]}")


def children(pid: int) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        try:
            if (
                d.name.isdigit()
                and int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid
            ):
                found.append(int(d.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


@pytest.fixture(scope="module")
def straight2(tmp_path_factory, sotu_dir) -> Path:
    cwd = tmp_path_factory.mktemp("straight2")
    proc = torchrun(cwd, f"data.dir={sotu_dir}", f"out_dir={cwd / 'run'}")
    log = finish(proc)
    assert proc.returncode == 0, log
    return cwd / "run"


@pytest.mark.slow
def test_sigterm_under_torchrun_stops_every_rank_and_resume_is_exact(tmp_path, sotu_dir, straight2):
    out = tmp_path / "run"
    args = (f"data.dir={sotu_dir}", f"out_dir={out}")
    proc = torchrun(tmp_path, *args)
    wait_for_step("run/metrics.jsonl", tmp_path, 3, proc)
    os.killpg(proc.pid, signal.SIGTERM)  # what Slurm does: every process of the step
    log = finish(proc)
    assert "stopped on SIGTERM at step" in log, log
    assert proc.returncode == 1  # torchrun's own status when signalled (docs/failures.md)
    step = ckpt.load_checkpoint(ckpt.latest_checkpoint(out))["step"]
    assert 3 <= step < 10 and not (out / "summary.json").exists()
    proc = torchrun(tmp_path, *args)  # the same command again
    log = finish(proc)
    assert proc.returncode == 0 and f"at step {step}" in log, log
    assert numbers(out) == numbers(straight2)
    # Finished: relaunched with one process, nothing changes (world size 2 stays recorded).
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    summary = run(out, sotu_dir, *OVERRIDES)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert summary["world_size"] == 2 and summary["final_val_loss"] is not None


@pytest.mark.slow
def test_torchrun_restart_after_a_killed_worker_continues_the_same_run(
    tmp_path, sotu_dir, straight2
):
    """No out_dir: the restarted workers name the same default run directory (it depends on the
    command line only) and continue the run."""
    proc = torchrun(tmp_path, f"data.dir={sotu_dir}", "ckpt_every=2", restarts=1)
    wait_for_step("runs/*/metrics.jsonl", tmp_path, 5, proc)
    workers = children(proc.pid)
    assert len(workers) == 2, workers
    os.kill(workers[1], signal.SIGKILL)
    log = finish(proc)
    assert proc.returncode == 0, log
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert "resumed from" in log and str(run_dir.name) in log
    assert numbers(run_dir) == numbers(straight2)


def test_ctrl_c_stops_with_a_checkpoint_and_exit_130(tmp_path, sotu_dir, straight, monkeypatch):
    from trainer.preemption import INTERRUPT_EXIT_CODE

    out = tmp_path / "run"
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where the suite runs in the background
    signal_at_step(monkeypatch, 3, signal.SIGINT)
    with pytest.raises(Preempted) as info:
        run(out, sotu_dir, *COMMON)
    assert info.value.code == INTERRUPT_EXIT_CODE == 130 and info.value.step == 3
    assert "stopped on SIGINT at step 3" in str(info.value)
    assert "run the same command again" in str(info.value)
    assert "requeue" not in str(info.value)
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["step_0000003.pt"]
    assert signal.getsignal(signal.SIGINT) is before  # put back
    monkeypatch.undo()
    run(out, sotu_dir, *COMMON)
    assert numbers(out) == numbers(straight)


def test_a_second_ctrl_c_exits_at_once_but_torchruns_copy_does_not(monkeypatch, capfd):
    import trainer.preemption as preemption

    exits, clock = [], [100.0]
    monkeypatch.setattr(preemption.os, "_exit", exits.append)
    monkeypatch.setattr(preemption.time, "monotonic", lambda: clock[0])
    guard = preemption.PreemptionGuard()
    guard._handle(signal.SIGINT, None)
    assert guard.received == signal.SIGINT and exits == []
    clock[0] += 0.01  # torchrun forwards the same press a moment later
    guard._handle(signal.SIGINT, None)
    assert exits == []
    clock[0] += 2.0  # the user presses again
    guard._handle(signal.SIGINT, None)
    assert exits == [130]
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 2 and "Ctrl-C again to exit at once" in err[0]
    assert "second Ctrl-C: exiting now, without a checkpoint" in err[1]


@pytest.mark.slow
def test_ctrl_c_at_the_command_line_is_one_line_and_exit_130(tmp_path, sotu_dir):
    """Ctrl-C during the imports and set-up: one line, no traceback, exit 130 (in the loop the
    same holds, with a checkpoint: the tests above)."""
    cmd = [sys.executable, str(ROOT / "train.py"), *FAST, f"data.dir={sotu_dir}", "max_steps=5",
           f"out_dir={tmp_path / 'run'}", "progress=false"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                                        signal.SIG_DFL))  # fmt: skip
    time.sleep(1.0)  # importing torch: seconds
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
