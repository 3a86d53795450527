"""Checkpoints that cannot run code or lie (docs/checkpoints.md): a planted pickle in any file
of a checkpoint runs nothing on any of the six paths that open one, and every checkpoint carries
checksums that are checked before it is used."""

from __future__ import annotations

import logging
import os
import pickle
import re
import shutil
from pathlib import Path

import pytest
import torch
from test_bad_input import config_with, fake_checkpoint

from scripts.convert_checkpoint import main as convert
from scripts.export_hf import main as export_hf
from scripts.sample import main as sample
from trainer import checkpoint as ckpt
from trainer import checksums, command_line
from trainer.dcp_checkpoint import METADATA, TRAIN_STATE, DcpCheckpointer, load_dcp
from trainer.safe_metadata import UnsafeMetadata, read_metadata


class Planted:
    """A pickle that runs a shell command when it is loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def real_dcp(directory: Path, step: int = 1) -> Path:
    """A DCP checkpoint of a tiny model with this codebase's side file (a fake config)."""
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(1, 3)).sum().backward()
    opt.step()
    side = torch.load(fake_checkpoint(directory / "side.pt"), weights_only=True)
    (directory / "side.pt").unlink()
    states = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    saver = DcpCheckpointer(asynchronous=False)
    return saver.save(directory, step, states, side, lambda _: None)


def plant(kind: str, run: Path, marker: Path) -> Path:
    """A checkpoint in ``run/checkpoints/`` with a code-running pickle in its file ``kind``."""
    d = run / "checkpoints"
    d.mkdir(parents=True, exist_ok=True)
    evil = pickle.dumps(Planted(marker))
    if kind == "step.pt":
        path = d / "step_0000001.pt"
        torch.save({"x": Planted(marker)}, path)
        return path
    path = real_dcp(d)
    (path / checksums.MANIFEST).unlink()  # as an old checkpoint, or one planted whole
    if kind == METADATA:
        (path / METADATA).write_bytes(evil)
    elif kind == TRAIN_STATE:
        torch.save({"x": Planted(marker)}, path / TRAIN_STATE)
    else:  # the tensor shard: its bytes are read as tensors, never unpickled
        (path / "__0_0.distcp").write_bytes(evil)
    return path


PATHS = {
    "eval.py checkpoint=": lambda p, tmp: __import__("evals.loading").loading.load_model(p),
    "resume=PATH": lambda p, tmp: command_line.to_typed(config_with(f"resume={p}")),
    "resume=auto": lambda p, tmp: ckpt.load_with_fallback(p, fall_back=True),
    "convert_checkpoint": lambda p, tmp: convert([str(p), "--out", str(tmp / "c.pt")]),
    "export_hf": lambda p, tmp: export_hf([str(p), str(tmp / "hf")]),
    "sample": lambda p, tmp: sample([str(p), "--device", "cpu", "-n", "1"]),
}


@pytest.mark.parametrize("kind", [METADATA, TRAIN_STATE, "__0_0.distcp", "step.pt"])
@pytest.mark.parametrize("path_name", list(PATHS))
def test_a_planted_pickle_runs_nothing_on_any_path(tmp_path, kind, path_name):
    if kind == "step.pt" and path_name == "convert_checkpoint":
        pytest.skip("conversion reads DCP directories only")
    marker = tmp_path / "ran"
    checkpoint = plant(kind, tmp_path / "run", marker)
    if kind == "__0_0.distcp" and path_name == "resume=PATH":  # reads only the config here
        PATHS[path_name](checkpoint, tmp_path)
        assert not marker.exists()
        return
    with pytest.raises((SystemExit, ValueError)) as info:
        PATHS[path_name](checkpoint, tmp_path)
    message = str(info.value.code if isinstance(info.value, SystemExit) else info.value)
    assert not marker.exists(), f"the planted pickle ran via {path_name}"
    assert "\n" not in message, message
    if kind == METADATA:
        assert "was refused unread: it names posix.system" in message, message


def test_the_allow_list_reads_what_torch_writes(tmp_path):
    path = real_dcp(tmp_path)
    meta = read_metadata(path / METADATA)
    assert "model/weight" in meta.state_dict_metadata
    c = load_dcp(path)
    assert c["model"]["weight"].shape == (2, 3) and c["step"] == 1


@pytest.mark.parametrize(
    "payload,expected",
    [
        (pickle.dumps(Planted(Path("/nonexistent/x"))), "which a DCP index never holds"),
        (pickle.dumps({"a": 1}), "is not a DCP index (it holds a dict)"),
        (b"\x80\x04garbage", "is not a DCP index"),
    ],
)
def test_a_foreign_index_is_refused_in_one_line(tmp_path, payload, expected):
    (tmp_path / METADATA).write_bytes(payload)
    with pytest.raises(UnsafeMetadata) as info:
        read_metadata(tmp_path / METADATA)
    assert expected in str(info.value) and "\n" not in str(info.value)


# --- checksums ----------------------------------------------------------------------------------


def flip_one_bit(path: Path, offset: int = -200) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1
    path.write_bytes(bytes(data))


def file_checkpoint(out: Path, step: int) -> Path:
    payload = torch.load(fake_checkpoint(out / "x.pt"), weights_only=True)
    (out / "x.pt").unlink()
    del payload["step"]
    payload["model"] = {"w": torch.arange(1000.0) + step}
    return ckpt.save_checkpoint(out, step, payload, keep=0)


def test_file_checkpoints_carry_a_checksum_checked_on_load(tmp_path):
    first, second = file_checkpoint(tmp_path, 1), file_checkpoint(tmp_path, 2)
    side = checksums.sidecar(second)
    digest = side.read_text().split()[0]
    assert side.read_text() == f"{digest}  {second.name}\n"  # sha256sum -c reads it
    assert digest == checksums.file_digest(second)
    flip_one_bit(second)
    with pytest.raises(checksums.ChecksumMismatch) as info:
        ckpt.load_checkpoint(second)  # resume=PATH: refused
    assert str(info.value).startswith(f"{second} fails its checksum") and "\n" not in str(
        info.value
    )
    used, c = ckpt.load_with_fallback(second, fall_back=True)  # resume=auto: the previous one
    assert used == first and c["step"] == 1


def test_dcp_checkpoints_carry_checksums_checked_on_load(tmp_path):
    d = tmp_path / "checkpoints"
    old, new = real_dcp(d, 1), real_dcp(d, 2)
    listed = (new / checksums.MANIFEST).read_text()
    assert {ln.split()[1] for ln in listed.splitlines()} == {TRAIN_STATE, METADATA, "__0_0.distcp"}
    flip_one_bit(new / "__0_0.distcp", offset=100)
    with pytest.raises(ValueError, match="__0_0.distcp fails its checksum"):
        load_dcp(new)
    used, c = ckpt.load_with_fallback(new, fall_back=True)
    assert used == old and c["step"] == 1
    (old / "extra").write_text("x")
    with pytest.raises(ValueError, match="is not in its checkpoint's checksum list"):
        load_dcp(old)


def test_old_checkpoints_load_with_a_one_line_note(tmp_path, caplog):
    path = file_checkpoint(tmp_path, 3)
    checksums.sidecar(path).unlink()
    with caplog.at_level(logging.WARNING):
        assert ckpt.load_checkpoint(path)["step"] == 3
    notes = [r.getMessage() for r in caplog.records if "carries no checksum" in r.getMessage()]
    assert notes == [f"{path} carries no checksum (written before checkpoints had them): loaded "
                     "unverified"]  # fmt: skip


def test_conversion_writes_a_checksum_and_pruning_removes_it(tmp_path):
    out = convert([str(real_dcp(tmp_path / "checkpoints")), "--out", str(tmp_path / "c.pt")])
    assert checksums.verify(out)
    for step in (1, 2, 3):
        file_checkpoint(tmp_path / "run", step)
    ckpt.prune_checkpoints(tmp_path / "run", keep=1)
    left = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert left == ["step_0000003.pt", "step_0000003.pt.sha256"]
    shutil.rmtree(tmp_path / "run")


def test_the_asynchronous_save_writes_its_checksums_in_its_writer(tmp_path):
    model = torch.nn.Linear(3, 2)
    side = torch.load(fake_checkpoint(tmp_path / "side.pt"), weights_only=True)
    saver = DcpCheckpointer(asynchronous=True)
    path = saver.save(tmp_path / "checkpoints", 3, {"model": model.state_dict(), "optimizer": {}},
                      side, lambda _: None)  # fmt: skip
    saver.close()  # waits for the writer, which hashes and commits
    assert checksums.verify(path) and load_dcp(path, parts=("model",))["step"] == 1


def test_no_code_reads_a_dcp_index_but_the_allow_list():
    """torch's FileSystemReader unpickles the index: only SafeFileSystemReader may be used."""
    from helpers import ROOT

    found = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in (".venv", "tests") or any(p.startswith(".") for p in rel.parts):
            continue
        text = path.read_text()
        found += [f"{rel}" for _ in re.finditer(r"(?<!Safe)FileSystemReader\(", text)]
    assert not found


def test_training_never_resumes_on_a_flipped_bit(tmp_path, sotu_dir, capsys):
    from test_preemption import run

    out, common = tmp_path / "run", ("ckpt_every=2", "keep_checkpoints=0", "eval_every=0")
    run(out, sotu_dir, "max_steps=4", *common)
    newest = out / "checkpoints" / "step_0000004.pt"
    flip_one_bit(newest, offset=len(newest.read_bytes()) // 2)  # inside a tensor: still parses
    with pytest.raises(SystemExit) as info:  # resume=PATH refuses
        run(out, sotu_dir, "max_steps=6", *common, f"resume={newest}")
    message = str(info.value)
    assert "\n" not in message and message.startswith(
        f"resume={newest}: {newest} fails its checksum"
    )
    capsys.readouterr()
    summary = run(out, sotu_dir, "max_steps=6", *common)  # resume=auto falls back to step 2
    printed = capsys.readouterr().out
    assert f"{newest} fails its checksum" in printed and "step_0000002.pt" in printed
    assert summary["steps"] == 6 and checksums.verify(newest)  # step 4 written again, intact
