"""The LLaMA experiment set (configs/experiment/llama/, llama-cpu/; docs/models.md): each run
composes through Hydra as train.py does it, with the EPFL benchmark's 124M settings written out
here independently of the files, no GPT-2 setting left over from the files whose optimizer values
it takes, the CPU set equal to the GPU set's optimizers on the CPU recipe, and the launcher runs
both sets."""

from __future__ import annotations

import pytest

from helpers import CONFIG_DIR, compose_config
from report.runs import flatten
from scripts import launch
from trainer import command_line

OPTIMIZERS = ("adamw", "muon", "mars-adamw", "mars-m")
# epfml/llm-optimizer-benchmark at fdecd5d, scripts/124m/*.sh
SHARED = {
    "model.name": "llama-124m", "model.arch": "llama", "max_steps": 128000,
    "batch_tokens": 256 * 512, "micro_batch_size": 64, "grad_scale": 1.0, "grad_clip": 0.5,
    "schedule.name": "cosine", "schedule.warmup_steps": 2000, "seed": 0,
    "data.name": "fineweb-edu-100b", "eval_tokens": 64 * 64 * 512,
}  # fmt: skip
OPTIMIZER_VALUES = {
    "adamw": {"optimizer.lr": 1e-3, "optimizer.betas": [0.8, 0.999], "optimizer.weight_decay": 0.1},
    "mars-adamw": {"optimizer.lr": 3e-3, "optimizer.betas": [0.95, 0.99], "optimizer.lr_1d": 1e-3,
                   "optimizer.betas_1d": [0.8, 0.999], "optimizer.weight_decay": 0.1,
                   "optimizer.weight_decay_1d": 0.1, "optimizer.gamma": 0.025,
                   "optimizer.mode": "approx", "optimizer.optimize_1d": False},
    "muon": {"optimizer.routing": "recommended"},  # the rest: owt/small-muon's
    "mars-m": {},  # owt/small-mars-m's
}  # fmt: skip
BOOKKEEPING = {"name", "wandb.group"}


def composed(experiment: str) -> dict:
    typed, plain = command_line.to_typed(compose_config(f"experiment={experiment}"))
    assert typed.name == plain["name"] == experiment
    return flatten(plain)


def optimizer_part(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if k.startswith("optimizer.")}


def rest(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if not k.startswith("optimizer.") and k not in BOOKKEEPING}


@pytest.fixture(scope="module")
def gpu_set():
    return {o: composed(f"llama/124m-{o}") for o in OPTIMIZERS}


def test_the_files_are_the_launch_tables():
    for folder, prefix in (("llama", "124m"), ("llama-cpu", "tiny")):
        found = sorted(p.stem for p in (CONFIG_DIR / "experiment" / folder).glob("*.yaml"))
        assert found == sorted(f"{prefix}-{o}" for o in OPTIMIZERS)
        assert [r.experiment for r in launch.table_runs(folder)] == [
            f"{folder}/{prefix}-{o}" for o in OPTIMIZERS
        ]


@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_gpu_runs_have_the_benchmarks_settings_and_their_optimizers_values(gpu_set, opt):
    cfg = gpu_set[opt]
    assert {k: cfg[k] for k in SHARED} == SHARED
    assert cfg["optimizer.name"] == opt
    assert {k: cfg[k] for k in OPTIMIZER_VALUES[opt]} == OPTIMIZER_VALUES[opt]
    if opt in ("muon", "mars-m"):  # every other optimizer value is the GPT-2 small run's
        paper = optimizer_part(composed(f"owt/small-{opt}"))
        mine = optimizer_part(cfg)
        assert {k: v for k, v in mine.items() if k not in OPTIMIZER_VALUES[opt]} == {
            k: v for k, v in paper.items() if k not in OPTIMIZER_VALUES[opt]
        }


def test_gpu_runs_differ_only_in_their_optimizer(gpu_set):
    base = rest(gpu_set["adamw"])
    for opt in OPTIMIZERS[1:]:  # no setting of owt/small-* (its data, batch, clip...) remains
        assert rest(gpu_set[opt]) == base, opt


@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_cpu_runs_are_the_gpu_optimizers_on_the_cpu_recipe(gpu_set, opt):
    cpu = composed(f"llama-cpu/tiny-{opt}")
    assert optimizer_part(cpu) == optimizer_part(gpu_set[opt])
    recipe = rest(composed("sotu/tiny-adamw"))  # the CPU recipe, on the GPT tiny model
    mine = rest(cpu)
    differ = {k for k in recipe.keys() | mine.keys() if recipe.get(k) != mine.get(k)}
    assert {k for k in differ if not k.startswith("model.")} == {"grad_clip"}
    assert mine["grad_clip"] == 0.5 and mine["model.name"] == "llama-tiny"


def test_launcher_runs_both_sets(capsys, no_gpu):
    assert launch.main(["--dry-run", "--table", "llama-cpu"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if "train.py" in x]
    assert len(lines) == 4 and all("--nproc_per_node=1 " in x for x in lines)
    assert launch.main(["--dry-run", "--table", "llama", "--gpus", "8"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if "train.py" in x]
    assert len(lines) == 4 and all("micro_batch_size=32" in x for x in lines)  # 256 / 8 ranks
