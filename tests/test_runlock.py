"""One process per run directory (trainer/runlock.py): a second process is refused in one line
naming the holder, a dead holder's lock is taken over, and without working locks a marker file
stands in."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import platform
import signal
import subprocess
import sys

import pytest

import train
from helpers import ROOT, fast_config
from trainer import runlock
from trainer.runlock import RunDirBusy, RunLock

HOLD = """
import sys, time
sys.path.insert(0, {root!r})
from trainer.runlock import RunLock
RunLock({out!r}).acquire()
print("held", flush=True)
time.sleep(60)
"""


def holder_process(out):
    """A process that takes the lock of ``out`` and holds it until killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD.format(root=str(ROOT), out=str(out))],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_holder_is_refused_with_one_line_naming_the_first(tmp_path):
    out = tmp_path / "run"
    with RunLock(out):
        with pytest.raises(RunDirBusy) as info:
            RunLock(out).acquire()
        message = str(info.value)
        assert "\n" not in message
        assert message.startswith(f"{out} is in use by process {os.getpid()} on host "
                                  f"{platform.node()} since ")  # fmt: skip
        assert "give this run another name=NAME or out_dir=DIR" in message
    assert not (out / runlock.LOCK).exists()  # released: the holder file goes with it
    RunLock(out).acquire().release()


def test_a_killed_holders_lock_is_taken_over(tmp_path, caplog):
    out = tmp_path / "run"
    proc = holder_process(out)
    try:
        with pytest.raises(RunDirBusy, match=f"in use by process {proc.pid} on host"):
            RunLock(out).acquire()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with caplog.at_level("INFO"), RunLock(out):  # the kernel freed it: not stale
        assert json.loads((out / runlock.LOCK).read_text())["pid"] == os.getpid()
    assert f"took over the lock of process {proc.pid}" in caplog.text


def test_without_working_locks_a_marker_file_stands_in(tmp_path, monkeypatch):
    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    out = tmp_path / "run"
    out.mkdir()
    lock = RunLock(out).acquire()
    marker = out / runlock.MARKER
    assert json.loads(marker.read_text())["pid"] == os.getpid()
    with pytest.raises(RunDirBusy, match=f"rm {marker}"):
        RunLock(out).acquire()
    lock.release()
    assert not marker.exists()
    # a marker whose process is gone (same host) is stale: replaced
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    marker.write_text(json.dumps({"host": platform.node(), "pid": int(dead)}))
    RunLock(out).acquire().release()
    # one from another host cannot be judged: refused, with the way out
    marker.write_text(json.dumps({"host": "elsewhere", "pid": 1, "since": "then"}))
    with pytest.raises(RunDirBusy, match="process 1 on host elsewhere since then"):
        RunLock(out).acquire()


def test_train_refuses_a_held_run_directory_and_writes_nothing(tmp_path, sotu_dir):
    out = tmp_path / "run"
    typed, plain = fast_config(out, sotu_dir, "max_steps=1")
    with RunLock(out):
        before = sorted(p.name for p in out.iterdir())
        with pytest.raises(SystemExit, match=f"{out} is in use by process {os.getpid()}"):
            train.train(typed, plain)
        assert sorted(p.name for p in out.iterdir()) == before
    train.train(typed, plain)  # released: the run goes
    assert not (out / runlock.LOCK).exists()


def test_a_refused_run_leaves_no_directory(tmp_path):
    out = tmp_path / "new"
    lock = RunLock(out).acquire()
    lock.release()
    assert not out.exists()
