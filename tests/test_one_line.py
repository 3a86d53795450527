"""One line for every failure found by the adversarial test of issue 51 that belongs to training
(docs/failures.md, docs/input-checks.md): values out of range, a broken config.yaml, unusable
shards, no usable checkpoint, a full disk under meta.jsonl, metrics.jsonl or a checkpoint, and a
missing metrics.jsonl on resume. Where the failure is found before training, the run directory
is left untouched."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_bad_input import refused, snapshot
from test_preemption import run

from data.config import check_shards
from data.shards import HEADER_BYTES, write_shard
from runtime import runfiles
from trainer import checkpoint as ckpt
from trainer import command_line
from trainer.cli_checks import quote_paths, stray_words
from trainer.logs import MetricsLogger
from trainer.rundir import check_run_dir


@pytest.mark.parametrize(
    "override,expected",
    [
        ("optimizer.lr=1e308", "optimizer.lr must be at most 100 (a step that large overflows the "
                               "weights at once), got 1e+308"),
        ("max_steps=99999999999999999999", "max_steps must be at most 1,000,000,000,000"),
        ("micro_batch_size=99999999999", "lower micro_batch_size to at most 16"),
    ],
)  # fmt: skip
def test_out_of_range_values_are_refused(override, expected):
    assert expected in refused(override)


def test_a_path_split_by_the_shell_is_named_and_spaces_are_quoted():
    line = stray_words(["out_dir=my", "runs/x", "max_steps=3"])
    assert line == ("'runs/x' is not key=value (the rest of out_dir=my?): quote a value that "
                    "holds spaces, e.g. out_dir='my runs/x'")  # fmt: skip
    assert stray_words(["--cfg", "job", "max_steps=3", "-m"]) is None
    assert quote_paths(["out_dir=my runs/x"], ("out_dir",)) == ["out_dir='my runs/x'"]
    with pytest.raises(SystemExit, match=r"^config error: 'runs/x' is not key=value"):
        command_line.check_command_line(["out_dir=my", "runs/x"])  # before Hydra's lexer sees it


@pytest.mark.parametrize("text", ["a: [unclosed\n", "- a list\n- of things\n"])
def test_a_broken_config_yaml_is_one_line_and_left_alone(tmp_path, text):
    (tmp_path / runfiles.CONFIG).write_text(text)
    before = snapshot(tmp_path)
    with pytest.raises(SystemExit) as info:
        check_run_dir(tmp_path, {"max_steps": 1}, resuming=False)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{tmp_path / runfiles.CONFIG} ")
    assert "another name=NAME or out_dir=DIR" in message
    assert snapshot(tmp_path) == before


def shards_copy(sotu_dir: Path, tmp_path: Path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(sotu_dir, data)
    return data


def data_config(data_dir):
    from helpers import fast_config

    typed, _ = fast_config(Path("/nonexistent-out"), data_dir)
    return typed


@pytest.mark.parametrize("damage", ["truncated", "magic", "vocabulary"])
def test_unusable_shards_are_one_line_before_the_run_directory(tmp_path, sotu_dir, damage):
    data = shards_copy(sotu_dir, tmp_path)
    shard = sorted(data.glob("*_train_*.bin"))[0]
    if damage == "truncated":
        shard.write_bytes(shard.read_bytes()[: HEADER_BYTES + 100])
    elif damage == "magic":
        shard.write_bytes(b"\0\0\0\0" + shard.read_bytes()[4:])
    else:  # made by a tokenizer with more tokens than the model has
        header_id = int.from_bytes(shard.read_bytes()[12:16], "little")
        write_shard(shard, [60000] * 5000, tokenizer_id=header_id)
    typed = data_config(data)
    why = check_shards(typed.model.vocab_size, typed.data)
    expected = {"truncated": "is truncated or corrupt", "magic": "is not a token shard (magic 0",
                "vocabulary": "holds tokens outside the vocabulary"}[damage]  # fmt: skip
    assert why is not None and expected in why and "\n" not in why
    out = tmp_path / "run"
    with pytest.raises(SystemExit, match=f"data error: .*{expected[:20]}"):
        run(out, data, "max_steps=1")
    assert not out.exists()


def test_no_usable_checkpoint_is_one_line_that_falls_back_to_nothing(tmp_path, sotu_dir):
    out = tmp_path / "run"
    run(out, sotu_dir, "max_steps=4", "ckpt_every=2", "keep_checkpoints=0", "eval_every=0")
    for p in ckpt.list_checkpoints(out):
        p.write_bytes(p.read_bytes()[:1000])
    with pytest.raises(SystemExit) as info:
        run(out, sotu_dir, "max_steps=6", "ckpt_every=2", "keep_checkpoints=0", "eval_every=0")
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"no checkpoint of {out} can be used")
    assert "falls back" not in message and "move" in message


class FullDisk:
    """A file that takes half of a write, then reports a full disk."""

    def __init__(self, f):
        self.f = f

    def write(self, data):
        self.f.write(bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name):
        return getattr(self.f, name)


def test_a_full_disk_under_metrics_jsonl_is_one_line_and_no_half_line(tmp_path):
    logger = MetricsLogger(tmp_path, enabled=True)
    logger.log({"step": 1, "tokens": 10, "train_loss": 3.0})
    logger._file = FullDisk(logger._file)
    with pytest.raises(SystemExit) as info:
        logger.log({"step": 2, "tokens": 20, "train_loss": 2.9})
    message = str(info.value)
    assert "\n" not in message and "No space left on device" in message
    assert message.startswith(f"could not write {tmp_path / runfiles.METRICS}: ")
    logger._file = logger._file.f
    logger.close()
    assert runfiles.read_jsonl(tmp_path / runfiles.METRICS) == [
        {"step": 1, "tokens": 10, "train_loss": 3.0}
    ]
    assert (tmp_path / runfiles.METRICS).read_text().endswith("}\n")


def test_a_full_disk_under_meta_jsonl_is_one_line(tmp_path, sotu_dir, monkeypatch):
    """The run's first write of meta.jsonl meets a full disk: one line, and no half line left.
    (The disk is made full for that one file: a symlink to /dev/full would also be read, as
    the earlier sessions are, and reading it never ends.)"""
    real_open = open

    class FullMeta(FullDisk):
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def open_full(path, mode="r", *args, **kwargs):
        f = real_open(path, mode, *args, **kwargs)
        return FullMeta(f) if Path(path).name == runfiles.META and "a" in mode else f

    monkeypatch.setattr(runfiles, "open", open_full, raising=False)
    out = tmp_path / "run"
    out.mkdir()
    with pytest.raises(SystemExit) as info:
        run(out, sotu_dir, "max_steps=1")
    message = str(info.value)
    assert "\n" not in message and f"could not write {out / runfiles.META}: No space" in message
    assert (out / runfiles.META).read_bytes() == b""  # the half line was cut back


def test_a_full_disk_at_a_checkpoint_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10, 10, 0))
    exc = RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 4416 vs 4310")
    assert ckpt.write_failure(exc, tmp_path / "step_1.pt") == "No space left on device"
    message = str(ckpt.CheckpointWriteError(tmp_path / "checkpoints" / "step_1.pt", exc))
    assert "No space left on device" in message and "inline_container" not in message


def test_a_missing_metrics_jsonl_on_resume_is_said_and_marked(tmp_path, sotu_dir, capsys):
    out = tmp_path / "run"
    run(out, sotu_dir, "max_steps=2", "eval_every=0")
    (out / runfiles.METRICS).unlink()
    capsys.readouterr()
    run(out, sotu_dir, "max_steps=4", "eval_every=0")
    gap = "metrics.jsonl was missing when the run resumed at step 2: steps 1-2 not kept"
    assert gap in capsys.readouterr().out  # the log (stdout)
    records = runfiles.read_jsonl(out / runfiles.METRICS)
    assert records[0] == {"step": 2, "tokens": None, "gap": gap}
    assert [r["step"] for r in records[1:] if "train_loss" in r] == [3, 4]
    assert json.loads((out / runfiles.SUMMARY).read_text())["steps"] == 4


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_full_disk_under_a_dcp_checkpoint_is_one_line(tmp_path, monkeypatch, asynchronous):
    import torch
    from torch.distributed.checkpoint.api import CheckpointException

    from trainer import dcp_checkpoint as dcpc

    def full(*args, **kwargs):
        raise CheckpointException(
            "write", {0: (OSError(errno.ENOSPC, "No space left on device"), None)}
        )

    monkeypatch.setattr(dcpc.DcpCheckpointer, "_finish", lambda *a: full())
    saver = dcpc.DcpCheckpointer(asynchronous=asynchronous)
    states = {"model": {"w": torch.zeros(3)}, "optimizer": {}}
    with pytest.raises(SystemExit) as info:
        saver.save(tmp_path, 2, states, {"step": 2}, lambda _: None)
        saver.wait()  # the asynchronous save fails in its writer: said when it is waited for
    message = str(info.value)
    final = dcpc.step_dir(tmp_path, 2)
    assert "\n" not in message and message.startswith(
        f"could not write checkpoint {final}: No space left on device. Nothing was replaced"
    )
    saver.close()


def test_a_split_without_one_window_is_one_line_before_the_run(tmp_path):
    """Shards each shorter than seq_len+1 tokens: the loader would skip every one; the check
    says so before the run directory is touched, naming the longest shard and the fix."""
    from data.config import DataConfig, check_shards
    from data.shards import write_shard

    write_shard(tmp_path / "x_train_000000.bin", np.arange(40) % 50)
    write_shard(tmp_path / "x_train_000001.bin", np.arange(30) % 50)
    write_shard(tmp_path / "x_val_000000.bin", np.arange(200) % 50)
    cfg = DataConfig(name="x", dir=str(tmp_path))
    assert check_shards(50257, cfg, seq_len=32) is None  # 40 >= 33: a window
    why = check_shards(50257, cfg, seq_len=64)
    assert "\n" not in why and "x_train_000000.bin holds 40 tokens" in why
    assert "seq_len+1 = 65" in why and "a seq_len of at most 39" in why
    assert "(and the 1 other training shard(s) are no longer)" in why


def test_a_read_only_run_directory_is_one_line(tmp_path, monkeypatch):
    """Storage that refuses the run directory (a read-only mount): one line naming it and the
    fix, nothing written; the storage's words for each errno."""
    from runtime.files import storage_problem
    from trainer.runlock import RunDirUnwritable, RunLock

    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    out = tmp_path / "runs" / "x"
    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.raises(RunDirUnwritable) as info:
        RunLock(out).acquire()
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{out} is on read-only storage: ")
    assert "out_dir=COPY" in message and not out.exists()
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert storage_problem("d", full) == "d is on a full disk (no space left on device)"
    other = OSError(errno.EIO, os.strerror(errno.EIO))
    assert storage_problem("d", other) == f"cannot write to d: {os.strerror(errno.EIO)}"


def test_eval_val_tokens_has_one_meaning_for_the_whole_split():
    """val_tokens=all: the whole split; null: the run's eval_tokens; 0 is refused in one line
    (train.py refuses eval_tokens=0; it once meant the whole split here)."""
    from evals.config import EvalConfig

    assert EvalConfig(val_tokens="all").val_budget(4096) is None
    assert EvalConfig().val_budget(4096) == 4096 and EvalConfig(val_tokens=64).val_budget(9) == 64
    for bad in (0, -1, "most", True):
        with pytest.raises(ValueError, match="val_tokens=all evaluates the whole"):
            EvalConfig(val_tokens=bad)


def test_training_ends_with_a_closing_line(tmp_path, sotu_dir, capsys):
    """A finished run says so in its last line: steps, tokens, the final validation loss, the
    session's seconds and where the run is."""
    out = tmp_path / "run"
    summary = run(out, sotu_dir, "max_steps=2", "eval_every=0")
    last = capsys.readouterr().out.strip().splitlines()[-1]  # the log (stdout)
    assert f"done: 2 steps, {summary['tokens']:,} tokens" in last
    assert f"final val loss {summary['final_val_loss']:.4f}" in last and last.endswith(f": {out}")
