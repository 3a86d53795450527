"""The config key ``tf32``: the float32 matmul precision a run asks for reaches torch's backend
flags (runtime.device.configure_backends), is recorded in the run's files, and the study's
experiment asks for true float32 (configs/experiment/study.yaml)."""

from __future__ import annotations

import pytest
import torch
import yaml

from runtime.device import configure_backends, matmul_precision
from trainer.rundir import same_arithmetic


@pytest.fixture
def restore_flags():
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision())  # fmt: skip
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
    torch.set_float32_matmul_precision(saved[2])


@pytest.mark.parametrize("tf32", [True, False])
def test_the_setting_reaches_torchs_cuda_flags(tf32, restore_flags):
    torch.backends.cuda.matmul.allow_tf32 = not tf32  # the opposite first: the call sets it
    torch.backends.cudnn.allow_tf32 = not tf32
    torch.set_float32_matmul_precision("medium")
    configure_backends(torch.device("cuda"), tf32=tf32)  # flags only: no GPU needed
    assert torch.backends.cuda.matmul.allow_tf32 is tf32
    assert torch.backends.cudnn.allow_tf32 is tf32
    assert torch.get_float32_matmul_precision() == ("high" if tf32 else "highest")
    assert matmul_precision(torch.device("cuda")) == {
        "tf32": tf32, "float32_matmul_precision": "high" if tf32 else "highest"}  # fmt: skip


def test_a_cpu_run_leaves_the_precision_alone(restore_flags):
    """A CPU has no TF32: its runs compute the same whatever the key says."""
    torch.set_float32_matmul_precision("highest")
    configure_backends(torch.device("cpu"), tf32=True)
    assert torch.get_float32_matmul_precision() == "highest"
    assert matmul_precision(torch.device("cpu"))["tf32"] is None


def test_study_runs_ask_for_true_float32():
    from trainer.command_line import compose_typed

    cfg, values = compose_typed(["experiment=study"])
    assert (cfg.dtype, cfg.tf32) == ("float32", False)
    assert (values["dtype"], values["tf32"]) == ("float32", False)  # the saved config.yaml's
    demo, demo_values = compose_typed([])
    assert demo.tf32 is True and demo_values["tf32"] is True  # the default: as before the key
    study = yaml.safe_load(open("configs/experiment/study.yaml"))
    assert study["tf32"] is False


def test_tf32_is_a_difference_on_cuda_only():
    old, new = {"dtype": "auto"}, {"dtype": "float32", "tf32": False}  # old: before the key
    a, b = same_arithmetic(old, new, "cpu", "cpu")
    assert a["tf32"] == b["tf32"] is False and a["dtype"] == b["dtype"] == "float32"
    a, b = same_arithmetic({"dtype": "float32"}, new, "cuda:0", "cuda:0")
    assert a.get("tf32", True) is True and b["tf32"] is False  # stays a difference
