import pytest
import torch

from runtime.device import peak_flops, peak_flops_of, resolve_dtype
from trainer import checkpoint as ckpt
from trainer.config import config_differences


@pytest.mark.parametrize(
    "name,flops",
    [
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H200", 989e12),
        ("Some Future GPU", None),
    ],
)
def test_peak_table(name, flops):
    assert peak_flops_of(name) == flops


def test_no_peak_and_fp32_on_cpu():
    assert peak_flops(torch.device("cpu")) is None
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    with pytest.raises(ValueError, match="valid dtypes"):
        resolve_dtype("fp8", torch.device("cpu"))


def _payload():
    return {
        "model": {"w": torch.ones(2)},
        "optimizer": {},
        "loader": {"consumed": 3},
        "rng": [ckpt.rng_state(torch.device("cpu"))],
        "config": {"seed": 1},
    }


def test_checkpoint_round_trip_and_retention(tmp_path):
    for step in (10, 20, 30):
        ckpt.save_checkpoint(tmp_path, step, _payload(), keep=2)
    names = [p.name for p in ckpt.list_checkpoints(tmp_path)]
    assert names == ["step_0000020.pt", "step_0000030.pt"]
    assert not list((tmp_path / "checkpoints").glob(".*tmp*"))  # no temporary files left
    c = ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path))
    assert c["step"] == 30 and c["loader"] == {"consumed": 3}
    assert ckpt.resolve_resume("auto", tmp_path).name == "step_0000030.pt"
    assert ckpt.resolve_resume(str(tmp_path), tmp_path / "elsewhere").name == "step_0000030.pt"
    assert ckpt.resolve_resume("never", tmp_path) is None


def test_bad_checkpoints_are_named(tmp_path):
    path = ckpt.save_checkpoint(tmp_path, 1, _payload(), keep=0)
    path.write_bytes(path.read_bytes()[:100])  # truncated: its checksum says so first
    with pytest.raises(ValueError, match="fails its checksum"):
        ckpt.load_checkpoint(path)
    for sidecar in tmp_path.glob("**/*.sha256"):  # a checkpoint written before checksums
        sidecar.unlink()
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        ckpt.load_checkpoint(path)
    other = tmp_path / "other.pt"
    torch.save({"state_dict": {}}, other)  # some other program's file
    with pytest.raises(ValueError, match="not a checkpoint of this codebase"):
        ckpt.load_checkpoint(other)
    with pytest.raises(FileNotFoundError, match="resume=auto, resume=never"):
        ckpt.resolve_resume(str(tmp_path / "missing.pt"), tmp_path)


def test_incompatible_model_is_a_clear_error():
    model = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match="does not fit the configured model"):
        ckpt.load_model_state(model, {"weight": torch.zeros(5, 5)}, "x.pt")


def test_config_differences_ignore_resumable_keys():
    old = {"max_steps": 10, "seed": 1, "optimizer": {"lr": 1e-3}, "wandb": {"mode": "offline"}}
    new = {"max_steps": 20, "seed": 1, "optimizer": {"lr": 2e-3}, "wandb": {"mode": "disabled"}}
    assert config_differences(old, new) == ["optimizer.lr: 0.001 -> 0.002"]


def _run_dir(path, dtype, device):
    """A run directory as train.py leaves it: its config and the session that said its device."""
    from runtime import runfiles

    path.mkdir()
    runfiles.write_config(path, {"seed": 1, "dtype": dtype})
    if device is not None:
        runfiles.append_meta(path, {"started": "then", "device": device})
    return path


def test_a_run_continues_in_the_arithmetic_it_ran_in(tmp_path):
    """``dtype`` is compared as what it meant on each session's device: ``auto`` on a CPU is
    float32, so ``dtype=float32`` continues that run (on a CPU or a GPU), while a GPU continuing
    it as ``auto`` (bf16 autocast) is refused, naming both; a run dir with no device on record is
    compared as written."""
    from trainer.rundir import check_run_dir

    cpu = _run_dir(tmp_path / "cpu", "auto", "cpu")
    for dtype, device in (("float32", "cpu"), ("float32", "cuda:0"), ("auto", "cpu")):
        check_run_dir(cpu, {"seed": 1, "dtype": dtype}, resuming=True, device=device)
    with pytest.raises(SystemExit) as err:
        check_run_dir(cpu, {"seed": 1, "dtype": "auto"}, resuming=True, device="cuda:0")
    assert "dtype: 'auto (float32 on cpu)' -> 'auto (bfloat16 on cuda:0)'" in str(err.value)
    gpu = _run_dir(tmp_path / "gpu", "auto", "cuda:0")  # ran bf16: float32 is another run
    check_run_dir(gpu, {"seed": 1, "dtype": "bfloat16"}, resuming=True, device="cuda:0")
    with pytest.raises(SystemExit, match="dtype: 'auto \\(bfloat16 on cuda:0\\)' -> 'float32'"):
        check_run_dir(gpu, {"seed": 1, "dtype": "float32"}, resuming=True, device="cuda:0")
    with pytest.raises(SystemExit, match="bfloat16 on cuda:0.*float32 on cpu"):
        check_run_dir(gpu, {"seed": 1, "dtype": "auto"}, resuming=True, device="cpu")
    old = _run_dir(tmp_path / "old", "auto", None)  # no meta.jsonl: as written
    check_run_dir(old, {"seed": 1, "dtype": "auto"}, resuming=True, device="cpu")
    with pytest.raises(SystemExit, match="dtype: 'auto' -> 'float32'"):
        check_run_dir(old, {"seed": 1, "dtype": "float32"}, resuming=True, device="cpu")


def test_bench_script_runs():
    import subprocess
    import sys

    from helpers import ROOT

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.train_step",
            "--micro-batch",
            "4",
            "--batch-seqs",
            "4",
            "--steps",
            "1",
            "--device",
            "cpu",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "device: cpu" in proc.stdout and "tokens/s" in proc.stdout


def test_config_differences_accept_a_key_an_earlier_version_lacked_at_its_default():
    old = {"model": {"n_layer": 2}, "seed": 1}
    new = {"model": {"n_layer": 2, "arch": "gpt2", "tie_embeddings": None}, "seed": 1}
    assert config_differences(old, new) == []
    new["model"]["arch"] = "llama"
    assert config_differences(old, new) == ["model.arch: '<absent>' -> 'llama'"]


def test_config_differences_accept_an_optimizer_field_an_earlier_version_lacked():
    old = {"optimizer": {"name": "mars-adamw", "gamma": 0.025}}
    new = {"optimizer": {"name": "mars-adamw", "gamma": 0.025, "gamma_schedule": "constant"}}
    assert config_differences(old, new) == []
    new["optimizer"]["gamma_schedule"] = "linear"
    assert config_differences(old, new) == ["optimizer.gamma_schedule: '<absent>' -> 'linear'"]
