"""Composition order, run-directory names, and sweeps: Hydra multirun inside one torchrun (one
process group for every job) and through the submitit launcher (2 jobs of 2 processes)."""

import json
import os
import subprocess
import sys

import pytest

from helpers import FAST, ROOT, compose_config
from trainer import command_line
from trainer.rundir import override_tag, run_dir_name, sweep_job_dir_name

# --- composition: a chosen group's values hold -------------------------------------------------


def test_chosen_groups_hold_against_the_demo():
    typed, _ = command_line.to_typed(compose_config("model=gpt2-small", "data=openwebtext",
                                             "schedule=cosine"))  # fmt: skip
    assert typed.schedule.warmup_steps == 2000 and typed.schedule.min_lr == 3e-5
    assert typed.model.n_layer == 12 and typed.data.name == "openwebtext"
    wsd, _ = command_line.to_typed(compose_config("schedule=wsd"))
    assert wsd.schedule.name == "wsd" and wsd.schedule.warmup_steps == 2000


@pytest.mark.parametrize("overrides", [(), ("experiment=demo",)])
def test_the_demo_is_the_default_experiment(overrides):
    typed, plain = command_line.to_typed(compose_config(*overrides))
    assert typed.model.name == "tiny" and typed.data.name == "sotu"
    assert typed.optimizer.name == "adamw" and typed.max_steps == 150
    assert typed.schedule.warmup_steps == 15 and typed.schedule.min_lr == 1e-4
    assert typed.batch_tokens == 2048 and typed.eval_tokens == 16384
    assert plain["name"] == "adamw"  # the optimizer's name: runs/adamw


def test_command_line_wins_over_the_demo():
    typed, _ = command_line.to_typed(compose_config("max_steps=7", "schedule.warmup_steps=3"))
    assert typed.max_steps == 7 and typed.schedule.warmup_steps == 3


# --- names ---------------------------------------------------------------------------------------


def test_run_dir_names_say_what_differs():
    assert run_dir_name("adamw", []) == "runs/adamw"
    assert run_dir_name("mars-adamw", ["optimizer=mars-adamw", "optimizer.lr=0.003", "seed=2",
                                       "progress=false", "out_dir=x", "wandb.mode=offline"]
                        ) == "runs/mars-adamw_optimizer.lr=0.003,seed=2"  # fmt: skip
    name = run_dir_name("owt/small-adamw", ["experiment=owt/small-adamw", "data.dir=/d/owt"])
    assert name == "runs/owt/small-adamw_data.dir=-d-owt"
    long = override_tag([f"optimizer.lr{i}={i}e-3" for i in range(40)])
    assert len(long) <= 120 and long != override_tag([f"optimizer.lr{i}={i}e-3" for i in range(41)])
    assert sweep_job_dir_name(["experiment=owt/small-adamw"], 0) == "experiment=owt-small-adamw"
    assert sweep_job_dir_name([], 3) == "job3"


def test_the_same_command_names_the_same_directory():
    """No time stamp; the order of the overrides does not matter, a key given twice counts with
    its last value (as Hydra does), and overrides that change nothing a run computes (where it
    runs, what it shows, how often it checkpoints) are left out."""
    a = run_dir_name("adamw", ["seed=2", "optimizer.lr=0.003"])
    assert (
        a
        == run_dir_name("adamw", ["optimizer.lr=0.003", "seed=2"])
        == run_dir_name("adamw", ["seed=1", "optimizer.lr=0.003", "seed=2"])
    )
    same = ["device=cpu", "compile=true", "log_every=1", "eval_every=0", "ckpt_every=5",
            "progress=false", "micro_batch_size=4", "wandb.mode=offline", "resume=auto"]  # fmt: skip
    assert run_dir_name("adamw", ["seed=2", "optimizer.lr=0.003", *same]) == a
    assert run_dir_name("adamw", ["max_steps=10"]) == "runs/adamw_max_steps=10"  # the schedule


def test_a_relaunched_sweep_names_the_same_directories(monkeypatch):
    from trainer import sweeps

    for _ in range(2):  # two launches of the same sweep command
        monkeypatch.delenv(sweeps.SWEEP_ENV, raising=False)
        sweeps.record_swept_keys(["optimizer.lr"])
        parent = sweeps.sweep_dir("adamw", ["seed=1", "optimizer.lr=0.001"])
        job = sweeps.sweep_job_dir(["seed=1", "optimizer.lr=0.001"], 0)
        assert (parent, job) == ("runs/adamw-sweep_seed=1", "optimizer.lr=0.001")
    monkeypatch.delenv(sweeps.SWEEP_ENV)
    sweeps.record_swept_keys(["optimizer"])
    assert sweeps.sweep_dir("adamw", ["optimizer=adamw", "seed=1"]) == "runs/sweep_seed=1"


# --- processes -----------------------------------------------------------------------------------


def _python(args, cwd, nproc=None, timeout=300):
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    env.pop("MARS_GPT2_SWEEP", None)
    launcher = [sys.executable]
    if nproc:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    proc = subprocess.run([*launcher, str(ROOT / "train.py"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _metrics(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    drop = ("tokens_per_s", "elapsed_s")  # timings differ from run to run
    return [{k: v for k, v in json.loads(line).items() if k not in drop} for line in lines]


def _common(sotu_dir):
    return [*FAST, f"data.dir={sotu_dir}", "max_steps=4", "optimizer=mars-adamw"]


def _assert_complete(run_dir, world_size):
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "meta.jsonl"):
        assert (run_dir / name).is_file(), run_dir / name
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["world_size"] == world_size
    # one process: the single file; several: the sharded DCP directory (checkpoint_format=auto)
    if world_size == 1:
        assert (run_dir / "checkpoints" / "step_0000004.pt").is_file()
    else:
        assert (run_dir / "checkpoints" / "step_0000004").is_dir()


def test_single_run_directory_is_named_after_the_run(tmp_path, sotu_dir):
    # eval_every=0 (the one evaluation at the end) is left out of the name, as progress; the
    # evaluation's size is not (eval_tokens: a slice of the held-out split, not all of it)
    args = ["optimizer=mars-adamw", "optimizer.lr=0.002", f"data.dir={sotu_dir}", "max_steps=1",
            "progress=false", "eval_every=0", "eval_tokens=1024"]  # fmt: skip
    _python(args, cwd=tmp_path)
    (made,) = (tmp_path / "runs").iterdir()
    data = str(sotu_dir).replace("/", "-")
    assert (
        made.name == f"mars-adamw_data.dir={data},eval_tokens=1024,max_steps=1,optimizer.lr=0.002"
    )


@pytest.mark.slow
def test_torchrun_multirun_jobs_equal_their_single_runs(tmp_path, sotu_dir):
    """Two jobs over one process group of 2 ranks; the second (the one that could inherit the
    first's state: the group, the seeds, compiled code) equals the same run launched alone."""
    common = _common(sotu_dir)
    _python(["--multirun", "seed=1", *common, "optimizer.lr=0.001,0.003"], tmp_path, nproc=2)
    (sweep,) = (tmp_path / "runs").iterdir()
    assert sweep.name.startswith("mars-adamw-sweep_")  # named by the overrides jobs share
    assert "optimizer.lr" not in sweep.name  # the swept key names the jobs, not the parent
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert jobs == ["optimizer.lr=0.001", "optimizer.lr=0.003"]
    for lr in ("0.001", "0.003"):
        _assert_complete(sweep / f"optimizer.lr={lr}", world_size=2)
    first, second = (_metrics(sweep / f"optimizer.lr={lr}") for lr in ("0.001", "0.003"))
    assert first[0]["val_loss"] == second[0]["val_loss"] and first[-1] != second[-1]
    alone = tmp_path / "alone"
    _python([*common, "optimizer.lr=0.003", "seed=1", f"out_dir={alone}"], tmp_path, nproc=2)
    assert second == _metrics(alone)  # bit for bit


@pytest.mark.slow
def test_submitit_local_multirun_runs_two_jobs_of_two_processes(tmp_path, sotu_dir):
    args = ["--multirun", *_common(sotu_dir), "optimizer.lr=0.001,0.003",
            "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2",
            "hydra.launcher.timeout_min=10"]  # fmt: skip
    _python(args, tmp_path, timeout=600)
    (sweep,) = (tmp_path / "runs").iterdir()
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert [p.name for p in jobs] == ["optimizer.lr=0.001", "optimizer.lr=0.003"]
    for job in jobs:
        _assert_complete(job, world_size=2)
    a, b = (_metrics(job) for job in jobs)
    assert a[0]["val_loss"] == b[0]["val_loss"] and a[-1] != b[-1]  # same start, other lr
