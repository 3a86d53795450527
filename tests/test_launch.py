"""scripts/launch.py: the commands that run each published table (nothing is launched here)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from runtime import commands as train_commands
from scripts import launch

ROOT = Path(__file__).resolve().parent.parent
GLOBAL_TOKENS = 491_520


RUN_COUNTS = {"owt": 10, "fineweb": 4, "llama": 4, "llama-cpu": 4, "mars-m": 20}  # mars-m last


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    """The same answers on a machine with GPUs as without; fixed executable names."""
    monkeypatch.setattr(launch, "visible_gpus", lambda: 0)
    monkeypatch.setattr(launch, "gpu_memory_gib", lambda: None)
    monkeypatch.setattr(train_commands, "torchrun_exe", lambda: ["torchrun"])
    monkeypatch.setattr(train_commands, "python_exe", lambda: ["python"])


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    rc = launch.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def commands(out: str) -> list[tuple[list[str], dict[str, str]]]:
    """(launcher args before train.py, train.py's key=value overrides) of each printed command."""
    found = []
    for line in out.splitlines():
        if line.startswith("#") or " train.py " not in line:
            continue
        argv = shlex.split(line.removeprefix("+ "))
        i = argv.index("train.py")
        found.append((argv[:i], dict(a.split("=", 1) for a in argv[i + 1 :] if "=" in a)))
    return found


def micro_by_size(cmds) -> dict[str, int]:
    sizes = {}
    for _, kv in cmds:
        size = kv["experiment"].split("/")[1].split("-")[0]
        sizes.setdefault(size, set()).add(int(kv["micro_batch_size"]))
    assert all(len(v) == 1 for v in sizes.values()), sizes
    return {k: v.pop() for k, v in sizes.items()}


CASES = {  # (gpus per node, nodes): micro-batch without a GPU; with --gpu-mem 80
    (1, 1): ({"small": 15, "medium": 15, "large": 5}, {"small": 160, "medium": 60, "large": 32}),
    (8, 1): ({"small": 15, "medium": 15, "large": 5}, {"small": 60, "medium": 60, "large": 30}),
    (8, 2): ({"small": 15, "medium": 15, "large": 5}, {"small": 30, "medium": 30, "large": 30}),
}


@pytest.mark.parametrize("gpu_mem", [None, 80])
@pytest.mark.parametrize("gpus,nodes", list(CASES))
def test_dry_run_commands(capsys, tmp_path, gpus, nodes, gpu_mem):
    argv = ["--table", "owt", "--gpus", str(gpus), "--dry-run", "--runs-dir", str(tmp_path)]
    if nodes > 1:
        argv += ["--nodes", str(nodes), "--node-rank", "1", "--rdzv", "node0:29500"]
    if gpu_mem:
        argv += ["--gpu-mem", str(gpu_mem)]
    rc, out, _ = run_main(capsys, *argv)
    assert rc == 0
    cmds = commands(out)
    assert len(cmds) == RUN_COUNTS["owt"]
    world = gpus * nodes
    for pre, kv in cmds:
        assert pre[0] == "torchrun" and f"--nproc_per_node={gpus}" in pre
        if nodes == 1:
            assert "--standalone" in pre and not any(a.startswith("--nnodes") for a in pre)
        else:
            assert "--standalone" not in pre
            assert {f"--nnodes={nodes}", "--node_rank=1", "--rdzv_backend=c10d"} <= set(pre)
            assert "--rdzv_endpoint=node0:29500" in pre
            assert f"--rdzv_id={kv['experiment'].replace('/', '-')}" in pre
        assert kv["out_dir"] == f"{tmp_path}/{kv['experiment']}"
        assert GLOBAL_TOKENS % (int(kv["micro_batch_size"]) * 1024 * world) == 0
    names = {kv["experiment"] for _, kv in cmds}
    assert "owt/small-mars-adamw-exact" in names and "owt/large-muon" in names
    assert micro_by_size(cmds) == CASES[(gpus, nodes)][1 if gpu_mem else 0]
    assert f"{480 // world} per-rank sequences" in out


def test_every_table_and_the_gamma_runs(capsys):
    for table, count in RUN_COUNTS.items():
        rc, out, _ = run_main(capsys, "--table", table, "--dry-run", "--gpus", "8")
        assert rc == 0 and len(commands(out)) == count
    gamma = [kv for _, kv in commands(out) if kv.get("optimizer.gamma") == "0.01"]
    assert len(gamma) == 5
    assert all(kv["experiment"].endswith("-mars-m") for kv in gamma)
    assert all(kv["out_dir"] == f"runs/paper/{kv['experiment']}-gamma0.01" for kv in gamma)
    assert {kv["experiment"] for kv in gamma} >= {"owt/small-mars-m", "fineweb-edu/xl-mars-m"}


def test_dry_run_defaults_to_8_gpus_and_passes_extra_overrides(capsys):
    rc, out, _ = run_main(capsys, "--table", "fineweb", "--dry-run", "--", "wandb.mode=offline")
    assert rc == 0
    cmds = commands(out)
    assert all("--nproc_per_node=8" in pre and kv["wandb.mode"] == "offline" for pre, kv in cmds)
    rc, out, _ = run_main(capsys, "--table", "fineweb", "--dry-run")
    assert not any("wandb" in a for _, kv in commands(out) for a in kv)


def write_run(run_dir: Path, steps: int | None, max_steps: int = 100_000, ckpt: int | None = None):
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(f"name: x\nmax_steps: {max_steps}\n")
    if steps is not None:
        (run_dir / "summary.json").write_text(json.dumps({"steps": steps}))
    if ckpt is not None:
        (run_dir / "checkpoints").mkdir()
        (run_dir / "checkpoints" / f"step_{ckpt}.pt").write_bytes(b"")


def test_finished_run_is_skipped_interrupted_runs_are_not(capsys, tmp_path):
    write_run(tmp_path / "owt/small-adamw", steps=100_000)
    write_run(tmp_path / "owt/small-muon", steps=40_000, ckpt=40_000)
    write_run(tmp_path / "owt/medium-adamw", steps=None, ckpt=7000)
    rc, out, _ = run_main(
        capsys, "--table", "owt", "--gpus", "8", "--dry-run", "--runs-dir", str(tmp_path)
    )
    assert rc == 0
    launched = [kv["experiment"] for _, kv in commands(out)]
    assert len(launched) == 9 and "owt/small-adamw" not in launched
    assert {"owt/small-muon", "owt/medium-adamw"} <= set(launched)
    assert "# skipped owt/small-adamw (finished: 100000/100000 steps)" in out
    skipped_line = next(line for line in out.splitlines() if line.startswith("# skipped"))
    assert "experiment=owt/small-adamw" in skipped_line  # the dry run shows its command too
    assert "resumes from its checkpoint at step 7000" in out


def test_runs_in_order_and_stops_at_a_failure(capsys, tmp_path, monkeypatch):
    write_run(tmp_path / "owt/small-adamw", steps=100_000)
    calls = []

    class FakePopen:
        def __init__(self, cmd, cwd):
            assert cwd == ROOT
            calls.append(cmd)

        def wait(self):
            return 3 if len(calls) == 2 else 0

    monkeypatch.setattr(launch.subprocess, "Popen", FakePopen)
    rc, out, err = run_main(capsys, "--table", "owt", "--gpus", "2", "--runs-dir", str(tmp_path))
    assert rc == 3 and len(calls) == 2
    assert "experiment=owt/small-muon" in calls[0] and "experiment=owt/small-mars-adamw" in calls[1]
    assert "run owt/small-mars-adamw failed (exit code 3)" in err and "re-running" in err


def test_slurm_submissions_start_together(capsys, tmp_path, monkeypatch):
    events = []

    class FakePopen:
        def __init__(self, cmd, cwd):
            events.append("start")

        def wait(self):
            events.append("wait")
            return 0

    monkeypatch.setattr(launch.subprocess, "Popen", FakePopen)
    argv = ["--table", "mars-m", "--slurm", "--gpus", "8", "--runs-dir", str(tmp_path)]
    rc, out, _ = run_main(capsys, *argv)
    assert rc == 0 and out.count("+ python train.py --multirun") == 4
    assert events == ["start"] * 4 + ["wait"] * 4  # each blocks until its jobs end


def test_slurm_dry_run(capsys, tmp_path):
    write_run(tmp_path / "owt/small-adamw", steps=100_000)
    argv = ["--table", "mars-m", "--slurm", "--gpus", "8", "--nodes", "2", "--dry-run"]
    argv += ["--slurm-partition", "gpu", "--runs-dir", str(tmp_path), "--", "wandb.mode=offline"]
    rc, out, _ = run_main(capsys, *argv)
    assert rc == 0
    cmds = commands(out)
    assert len(cmds) == 4  # {micro-batch 15, 5} x {gamma 0.025, gamma 0.01}
    plain, gamma = [], []
    for pre, kv in cmds:
        assert pre == ["python"]
        assert kv["hydra/launcher"] == "submitit_slurm"
        assert kv["hydra.launcher.nodes"] == "2" and kv["hydra.launcher.tasks_per_node"] == "8"
        assert kv["hydra.launcher.gpus_per_node"] == "8" and kv["hydra.launcher.partition"] == "gpu"
        assert kv["hydra.launcher.timeout_min"] == "1440" and kv["wandb.mode"] == "offline"
        assert GLOBAL_TOKENS % (int(kv["micro_batch_size"]) * 1024 * 16) == 0
        if "optimizer.gamma" in kv:
            assert kv["optimizer.gamma"] == "0.01"
            assert kv["out_dir"] == f"{tmp_path}/${{name}}-gamma0.01"
            gamma += kv["experiment"].split(",")
        else:
            assert kv["out_dir"] == f"{tmp_path}/${{name}}"
            plain += kv["experiment"].split(",")
    assert "--multirun" in out
    assert len(plain) == 14 and "owt/small-adamw" not in plain  # finished: not resubmitted
    assert sorted(gamma) == sorted(e for e in plain + ["owt/small-adamw"] if e.endswith("-mars-m"))


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--table", "imagenet"], "valid tables: owt, fineweb, mars-m"),
        (["--table", "owt", "--gpus", "8", "--nodes", "2", "--node-rank", "0"], "needs --rdzv"),
        (["--table", "owt", "--gpus", "7", "--dry-run"], "must divide 480: 1, 2, 3, 4, 5, 6, 8"),
        (
            ["--table", "owt", "--gpus", "8", "--micro-batch", "7"],
            "valid choices: 1, 2, 3, 4, 5, 6, 10",
        ),
        (["--table", "owt", "--only", "owt/xl-*", "--dry-run"], "the runs: owt/small-adamw"),
        (["--table", "owt"], "no GPU visible; pass --gpus"),
        (["--table", "owt", "--dry-run", "--", "out_dir=x"], "use --runs-dir"),
        (["--table", "owt", "--micro-batch", "5", "--gpu-mem", "80"], "not allowed with"),
    ],
)
def test_errors_are_one_clear_line(capsys, argv, message):
    rc, out, err = run_main(capsys, *argv)
    assert rc != 0
    assert message in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err and " train.py " not in out


def test_only_selects_runs(capsys):
    argv = ["--table", "mars-m", "--dry-run", "--only", "owt/small-*", "--only", "*xl-mars-m"]
    rc, out, _ = run_main(capsys, *argv)
    names = sorted(kv["out_dir"].removeprefix("runs/paper/") for _, kv in commands(out))
    assert rc == 0 and names == [
        "fineweb-edu/xl-mars-m", "owt/small-adamw", "owt/small-mars-m",
        "owt/small-mars-m-gamma0.01", "owt/small-moonlight",
    ]  # fmt: skip


def test_micro_batch_from_the_memory_model():
    """The launcher's pick is trainer.memory_model's: the largest divisor whose full estimate (DDP
    buckets, bf16 copies, context, margin) fits; larger models get no larger micro-batch."""
    from trainer.memory_model import GIB

    runs = launch.table_runs("fineweb") + launch.table_runs("owt")
    by_size = {}
    for r in runs:
        by_size.setdefault(r.size, []).append(r)
    order = ["gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl"]
    for mem in (40, 79.2, 141):
        picks = []
        for size in order:
            est = launch.estimator(by_size[size], world=8)
            b = launch.fitting_micro_batch(launch.divisors(60), mem, est)
            assert b is None or est(b).total <= mem * GIB
            bigger = [d for d in launch.divisors(60) if b and d > b]
            assert not bigger or est(bigger[0]).total > mem * GIB
            picks.append(b or 0)
        assert picks == sorted(picks, reverse=True)
    xl = launch.estimator(by_size["gpt2-xl"], world=8)
    assert xl(10).ddp_buckets == (0 if launch.BUCKET_VIEW else xl(10).weights)
    assert xl(10).total > xl(5).total > 50 * GIB  # MARS-AdamW's state, full count (old: 43.7)


def test_dcp_checkpoints_count_for_resuming(tmp_path):
    run = tmp_path / "run"
    write_run(run, steps=None)
    dcp = run / "checkpoints" / "step_3000"
    dcp.mkdir(parents=True)
    for name in (".metadata", "train_state.pt"):
        (dcp / name).write_bytes(b"")
    done, state = launch.run_state(run)
    assert not done and state == "interrupted: resumes from its checkpoint at step 3000"


def test_runs_and_sizes_come_from_the_configs():
    runs = launch.table_runs("fineweb")
    assert [r.experiment for r in runs] == [
        "fineweb-edu/small-adamw", "fineweb-edu/small-mars-adamw",
        "fineweb-edu/xl-adamw", "fineweb-edu/xl-mars-adamw",
    ]  # fmt: skip
    assert [r.size for r in runs] == ["gpt2-small"] * 2 + ["gpt2-xl"] * 2
    assert not hasattr(launch, "SIZES") and not hasattr(launch, "GLOBAL_SEQS")


def test_shell_script_from_repo_root():
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(
        ["bash", "scripts/paper_owt.sh", "--dry-run", "--gpus", "8"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = [
        line for line in proc.stdout.splitlines() if "--standalone --nproc_per_node=8 " in line
    ]
    assert len(lines) == 10 and all(
        "torchrun" in line or "torch.distributed.run" in line for line in lines
    )


def test_every_run_has_its_experiment_config():
    for table in RUN_COUNTS:
        for run in launch.table_runs(table):
            assert (ROOT / "configs" / "experiment" / f"{run.experiment}.yaml").is_file(), run
