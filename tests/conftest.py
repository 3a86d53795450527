"""Shared fixtures: wandb forced off, one prepared copy of the embedded corpus per session, and a
launcher that sees no GPU."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ["WANDB_MODE"] = "disabled"
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def sotu_dir(tmp_path_factory) -> Path:
    """The embedded corpus prepared once into token shards, shared by the tests."""
    from data import prepare_sotu

    out = tmp_path_factory.mktemp("sotu")
    prepare_sotu(out)
    return out


@pytest.fixture
def no_gpu(monkeypatch):
    """The launcher sees no GPU (scripts/launch.py): CPU tables run on one CPU process."""
    from scripts import launch

    monkeypatch.setattr(launch, "visible_gpus", lambda: 0)
    monkeypatch.setattr(launch, "gpu_memory_gib", lambda: None)
