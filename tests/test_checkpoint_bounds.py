"""Checkpoints that cannot hang or read outside themselves (issue 66): a skeleton whose shared
references make a 16 kB file a tree of 2^60 leaves, a DCP index entry pointing at a FIFO, at
``../`` or at an absolute path: each refused in one line within seconds, nothing read outside.
A checkpoint without its checksum beside checksummed siblings is damaged (resume=auto falls
back, resume=PATH refuses); "loaded unverified" only for runs that never had checksums, and
never before a refusal."""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import time
from pathlib import Path

import pytest
import torch
from test_integrity import file_checkpoint, flip_one_bit, real_dcp

from trainer import checkpoint as ckpt
from trainer import checksums
from trainer.dcp_checkpoint import METADATA, TRAIN_STATE, load_dcp
from trainer.safe_metadata import NODE_BUDGET, bounded, read_metadata


def dag(levels: int = 60) -> list:
    """A list whose walk visits 2^levels leaves; pickled, a few kB (each level shared)."""
    x: list = [0]
    for _ in range(levels):
        x = [x, x]
    return x


def _one_line_fast(call, match: str) -> str:  # noqa: ANN001
    t0 = time.perf_counter()
    with pytest.raises(ValueError) as info:
        call()
    assert time.perf_counter() - t0 < 10
    text = str(info.value)
    assert "\n" not in text and match in text, text
    return text


def test_the_budget_counts_shared_references_and_keeps_real_structures():
    assert bounded({"a": [1, 2, {"b": (3, 4)}]}, "x")
    with pytest.raises(ValueError, match=f"more than {NODE_BUDGET:,} nodes"):
        bounded(dag(), "x")
    deep: list = []
    for _ in range(1000):
        deep = [deep]
    with pytest.raises(ValueError, match="deeper than"):
        bounded(deep, "x")


def test_a_dag_in_a_file_checkpoint_is_one_line_within_seconds(tmp_path):
    path = tmp_path / "checkpoints" / "step_0000005.pt"
    path.parent.mkdir()
    torch.save({"format_version": 1, "skeleton": dag()}, path)
    assert path.stat().st_size < 20_000
    for call in (lambda: ckpt.load_checkpoint(path), lambda: ckpt.read_checkpoint(path)):
        _one_line_fast(call, "was refused: its structure is more than")


def test_a_dag_in_a_dcp_skeleton_is_one_line_within_seconds(tmp_path):
    d = real_dcp(tmp_path / "checkpoints", 1)
    side = torch.load(d / TRAIN_STATE, weights_only=True)
    side["skeleton"]["model"] = {"weight": dag()}
    torch.save(side, d / TRAIN_STATE)
    checksums.write_manifest(d)  # an attacker rewrites the list too
    _one_line_fast(lambda: load_dcp(d), f"{d / TRAIN_STATE} was refused: its structure")
    _one_line_fast(lambda: ckpt.read_checkpoint(d), "was refused: its structure")


def _point_index_at(d: Path, name: str) -> None:
    """Rewrite the DCP index of ``d`` so its first storage entry names ``name``; rewrite its
    checksum list to match (as a careful attacker would)."""
    meta = read_metadata(d / METADATA)
    key = next(iter(meta.storage_data))
    meta.storage_data[key] = dataclasses.replace(meta.storage_data[key], relative_path=name)
    (d / METADATA).write_bytes(pickle.dumps(meta))
    checksums.write_manifest(d)


@pytest.mark.parametrize("where", ["../outside.distcp", "ABSOLUTE", "sub/x.distcp"])
def test_an_index_that_points_outside_the_checkpoint_is_refused(tmp_path, where):
    d = real_dcp(tmp_path / "checkpoints", 1)
    outside = tmp_path / "checkpoints" / "outside.distcp"
    outside.write_bytes((d / "__0_0.distcp").read_bytes())
    os.chmod(outside, 0)  # read it and the test fails with a permission error, not a refusal
    name = str(outside) if where == "ABSOLUTE" else where
    _point_index_at(d, name)
    for call in (lambda: load_dcp(d), lambda: ckpt.load_checkpoint(d)):
        _one_line_fast(call, "not a plain file name inside the checkpoint")
    os.chmod(outside, 0o600)


def test_an_index_entry_naming_a_fifo_is_refused_without_opening_it(tmp_path):
    d = real_dcp(tmp_path / "checkpoints", 1)
    os.mkfifo(d / "pipe.distcp")
    _point_index_at(d, "pipe.distcp")
    for call in (lambda: load_dcp(d), lambda: ckpt.load_checkpoint(d)):
        _one_line_fast(call, "pipe.distcp is not a regular file")


def test_a_deleted_checksum_beside_a_checksummed_sibling_is_damage(tmp_path, caplog):
    """The issue's case: step 12 flipped and its .sha256 deleted, step 10 checksummed beside
    it: resume=auto falls back to step 10, resume=PATH refuses; no 'loaded unverified'."""
    first, second = file_checkpoint(tmp_path, 10), file_checkpoint(tmp_path, 12)
    flip_one_bit(second)
    checksums.sidecar(second).unlink()
    with caplog.at_level(logging.WARNING):
        text = _one_line_fast(lambda: ckpt.load_checkpoint(second), "carries no checksum while")
        assert first.name in text and "treated as damaged" in text
        used, c = ckpt.load_with_fallback(second, fall_back=True)
    assert used == first and c["step"] == 10
    assert "loaded unverified" not in caplog.text


def test_a_dcp_checkpoint_without_its_manifest_beside_one_with_it_is_damage(tmp_path):
    d = tmp_path / "checkpoints"
    old, new = real_dcp(d, 1), real_dcp(d, 2)
    (new / checksums.MANIFEST).unlink()
    _one_line_fast(lambda: load_dcp(new), "carries no checksum while")
    used, c = ckpt.load_with_fallback(new, fall_back=True)
    assert used == old and c["step"] == 1


def test_unverified_is_said_only_after_a_good_read_of_a_run_without_checksums(tmp_path, caplog):
    """A run that never had checksums: a good checkpoint loads with the note; a bad one is
    refused with no note before it."""
    good = file_checkpoint(tmp_path, 3)
    checksums.sidecar(good).unlink()
    bad = tmp_path / "other" / "step_0000004.pt"
    bad.parent.mkdir()
    torch.save({"hello": 1}, bad)
    with caplog.at_level(logging.WARNING):
        with pytest.raises(ValueError, match="not a checkpoint of this codebase"):
            ckpt.load_checkpoint(bad)
        assert "loaded unverified" not in caplog.text
        assert ckpt.load_checkpoint(good)["step"] == 3
    assert caplog.text.count("loaded unverified") == 1
