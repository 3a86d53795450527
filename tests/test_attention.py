"""The attention kernel chosen by measurement (runtime/attention.py): the agreement check, the
choice, the switches and the config's errors, on the CPU (the CUDA kernels' own run is in
bench.gpu_check's sdpa steps)."""

from __future__ import annotations

import logging

import pytest
import torch

from runtime import attention as att

SWITCHES = (
    torch.backends.cuda.flash_sdp_enabled,
    torch.backends.cuda.cudnn_sdp_enabled,
    torch.backends.cuda.mem_efficient_sdp_enabled,
    torch.backends.cuda.math_sdp_enabled,
)


@pytest.fixture
def switches():
    """The process's SDPA switches, restored after the test."""
    saved = tuple(f() for f in SWITCHES)
    yield lambda: tuple(f() for f in SWITCHES)
    att.set_sdpa_backend("torch")
    assert tuple(f() for f in SWITCHES) == saved


def test_a_named_kernel_is_the_only_one_on_and_torch_restores_the_order(switches):
    found = switches()
    att.set_sdpa_backend("cudnn")
    assert switches() == (False, True, False, False)
    att.set_sdpa_backend("math")
    assert switches() == (False, False, False, True)
    att.set_sdpa_backend("torch")
    assert switches() == found == tuple(att.TORCH_DEFAULTS.values())


def test_unknown_backend_names_the_valid_ones():
    from trainer.config import TrainConfig

    with pytest.raises(ValueError, match=r"unknown sdpa_backend 'flash2'.*'cudnn'"):
        TrainConfig(sdpa_backend="flash2")
    with pytest.raises(ValueError, match="valid"):
        att.set_sdpa_backend("fast")


def test_choice_is_the_fastest_kernel_that_agrees():
    times = {"flash": 0.54, "cudnn": 0.48, "efficient": 0.96}
    assert att.choose({"flash": 0.004, "cudnn": 0.005, "efficient": 0.004}, times) == "cudnn"
    # cuDNN faster but wrong (a planted error 10x bf16 noise): flash
    assert att.choose({"flash": 0.004, "cudnn": 0.05, "efficient": 0.004}, times) == "flash"
    # unable to run the shapes: left out
    assert att.choose({"flash": "unavailable: no kernel", "cudnn": 0.004,
                       "efficient": 0.004}, times) == "cudnn"  # fmt: skip
    # the tolerance follows flash's own error where that is larger than AGREE_RTOL
    assert att.choose({"flash": 0.008, "cudnn": 0.015, "efficient": 0.004}, times) == "cudnn"
    assert att.choose({"flash": "unavailable", "cudnn": "unavailable"}, {}) == "torch"


def test_agreement_measures_each_kernels_error_against_float32(monkeypatch):
    """Flash on the CPU (torch's CPU kernel) agrees with the fp32 math reference in fp32 to
    rounding and in bf16 within bf16 noise; a planted wrong kernel is measured as wrong; the CUDA
    kernels are reported unavailable on the CPU, not raised."""
    cpu = torch.device("cpu")
    shape = att.AttentionShape(batch=3, heads=2, tokens=24, head_dim=8, dtype=torch.float32)
    errors = att.agreement(shape, cpu)
    assert errors["flash"] < 1e-5
    assert errors["cudnn"].startswith("unavailable") and errors["efficient"].startswith("unav")
    bf16 = att.agreement(att.AttentionShape(3, 2, 24, 8, torch.bfloat16), cpu, ["flash"])
    assert 1e-4 < bf16["flash"] < att.AGREE_RTOL

    real = att._forward_backward

    def wrong(name, *a):  # "flash" returns its output scaled by 1.05 (5% off)
        y, g = real(name, *a)
        return (y * 1.05, g) if name == "flash" else (y, g)

    monkeypatch.setattr(att, "_forward_backward", wrong)
    assert att.agreement(shape, cpu, ["flash"])["flash"] == pytest.approx(0.05, rel=1e-3)


def test_measure_times_only_the_agreeing_kernels():
    cpu = torch.device("cpu")
    shape = att.AttentionShape(batch=2, heads=2, tokens=16, head_dim=8, dtype=torch.float32)
    timed = []
    result = att.measure(shape, cpu, timer=lambda n, s, d: timed.append(n) or 1.0)
    assert timed == ["flash"] and result["choice"] == "flash" and result["ms"] == {"flash": 1.0}
    assert att.time_kernel("flash", shape, cpu, reps=2) > 0  # the real timer runs


def test_configure_on_the_cpu_changes_nothing(switches, caplog):
    found = switches()
    shape = att.AttentionShape(2, 2, 16, 8, torch.float32)
    assert att.configure_sdpa("auto", torch.device("cpu"), shape) == {
        "setting": "auto", "choice": "torch"}  # fmt: skip
    with caplog.at_level(logging.WARNING):
        att.configure_sdpa("cudnn", torch.device("cpu"), shape)
    assert "applies to CUDA only" in caplog.text and switches() == found


def test_shape_of_a_run_reads_the_model():
    from model import GPTConfig

    cfg = GPTConfig(n_layer=2, n_head=4, n_embd=64, block_size=32, vocab_size=100, dropout=0.1)
    s = att.AttentionShape.of_run(cfg, 5, 32, torch.bfloat16)
    assert (s.batch, s.heads, s.tokens, s.head_dim, s.dropout) == (5, 4, 32, 16, 0.1)


def test_run_meta_records_the_attention_kernel(tmp_path, sotu_dir):
    """A run writes what was chosen into meta.jsonl (a CPU run: torch's kernels)."""
    import train
    from helpers import fast_config
    from runtime import runfiles

    train.train(*fast_config(tmp_path / "run", sotu_dir, "max_steps=1"))
    meta = runfiles.read_meta(tmp_path / "run")
    assert meta[-1]["sdpa"] == {"setting": "auto", "choice": "torch"}
