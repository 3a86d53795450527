"""Shared fixtures: wandb forced off, one prepared copy of the embedded corpus per session, and a
launcher that sees no GPU."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ["WANDB_MODE"] = "disabled"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# One thread per test process (and for the processes tests start), unless the caller says
# otherwise. CI runs two pytest-xdist workers on two cores: with torch's default of a thread per
# core, a small parallel op waits for a thread that another process has descheduled
# (Newton-Schulz of a 16 x 48 matrix in bf16: 0.4 ms on one thread, 58 ms on two with the other
# core busy). With two busy processes beside it, tests/test_optim_aux_lr.py took 349 s on two
# threads and 10 s on one; the whole suite, serially, 61 min and 16 min.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402  (after OMP_NUM_THREADS: torch reads it when its thread pool starts)

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


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
