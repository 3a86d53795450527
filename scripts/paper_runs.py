"""The paper tables' runs, read from configs/experiment/<dataset>/, the ablation sets'
(configs/experiment/ablation/, ablation-cpu/; docs/ablations.md), and their memory estimate
(trainer/memory_model.py) for scripts/launch.py."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from runtime.config_files import config_names, load_config
from trainer.trainer import GRADIENT_AS_BUCKET_VIEW

# table: (experiment directories, optimizers in launch order); the runs are the files there
TABLES = {
    "owt": (("owt",), ("adamw", "muon", "mars-adamw", "mars-adamw-exact")),
    "fineweb": (("fineweb-edu",), ("adamw", "mars-adamw")),
    "mars-m": (("owt", "fineweb-edu"), ("adamw", "moonlight", "mars-m")),
    # the LLaMA experiment set (docs/models.md): LLaMA 124M at the EPFL benchmark's settings
    "llama": (("llama",), ("adamw", "muon", "mars-adamw", "mars-m")),
    "llama-cpu": (("llama-cpu",), ("adamw", "muon", "mars-adamw", "mars-m")),
}
# The ablation sets (docs/ablations.md): one file per row, run in this order; lr-grid runs as the
# grid of ABLATION_GRID factors of its lr and lr_1d, less the centre (the `mars` row).
ABLATION_ROWS = ("mars", "adamw", "gamma0", "gamma0-noclip", "adamw-mars-hparams", "lr-grid",
                 "optimize-1d", "exact", "exact-half", "clip-global", "first-plain")  # fmt: skip
ABLATION_GRID = (0.5, 1.0, 2.0)
TABLES.update({"ablation": (("ablation",), ABLATION_ROWS),
               "ablation-cpu": (("ablation-cpu",), ABLATION_ROWS)})  # fmt: skip
CPU_TABLES = ("ablation-cpu", "llama-cpu")  # run on one CPU process when no GPU is visible
# Rows pinned to a share of the set's steps (exact-half: two gradients a step, half the steps):
# a `max_steps=N` override gives them that share of N.
STEPS_FRACTION = {"exact-half": 0.5}
MARS_M_GAMMAS = ("0.01",)  # the MARS-M plots show gamma 0.025 (the configs') and 0.01
BUCKET_VIEW = GRADIENT_AS_BUCKET_VIEW  # the Trainer's DDP setting, for the memory estimate


class LaunchError(Exception):
    """Bad input: reported as one line and a non-zero exit."""


@dataclass(frozen=True)
class TableRun:
    """One run of a table: an experiment file, and a variant of it (a suffix and its overrides)."""

    experiment: str  # configs/experiment/<experiment>.yaml
    suffix: str = ""  # a variant of the experiment: appended to its name and out_dir
    overrides: tuple[str, ...] = ()  # the variant's overrides

    @property
    def name(self) -> str:
        return self.experiment + self.suffix

    @property
    def config(self) -> dict:
        return _experiment(self.experiment)

    @property
    def steps_fraction(self) -> float:
        """The share of the set's steps this run takes (STEPS_FRACTION; 1 for most)."""
        return STEPS_FRACTION.get(self.experiment.rsplit("/", 1)[-1], 1.0)

    @property
    def size(self) -> str:
        """The run's model preset (configs/model/<size>.yaml)."""
        return self.config["model"]["name"]


@functools.cache
def _experiment(name: str) -> dict:
    return load_config(f"experiment/{name}")


@functools.cache
def _params(model: str) -> int:
    import torch

    from model import GPTConfig, build_model

    with torch.device("meta"):
        return build_model(GPTConfig(**load_config(f"model/{model}"))).num_params()


def table_runs(table: str) -> list[TableRun]:
    """The runs of a table, in launch order: dataset, model size, the table's optimizer order."""
    if table not in TABLES:
        raise LaunchError(f"unknown table {table!r}; valid tables: {', '.join(TABLES)}")
    dirs, optimizers = TABLES[table]
    if optimizers is ABLATION_ROWS:
        return ablation_runs(dirs[0])
    runs = []
    for d in dirs:
        found = []
        for stem in config_names(f"experiment/{d}"):
            label = stem.split("-", 1)[1] if "-" in stem else ""
            if label in optimizers:
                run = TableRun(f"{d}/{stem}")
                found.append((_params(run.size), optimizers.index(label), run))
        for _, _, run in sorted(found, key=lambda t: t[:2]):
            runs.append(run)
            if table == "mars-m" and run.experiment.endswith("-mars-m"):
                runs += [TableRun(run.experiment, f"-gamma{g}", (f"optimizer.gamma={g}",))
                         for g in MARS_M_GAMMAS]  # fmt: skip
    return runs


def ablation_runs(folder: str) -> list[TableRun]:
    """The rows of an ablation set (configs/experiment/<folder>/), lr-grid as its grid."""
    runs = []
    for row in ABLATION_ROWS:
        if row != "lr-grid":
            runs.append(TableRun(f"{folder}/{row}"))
            continue
        centre = _experiment(f"{folder}/lr-grid")["optimizer"]
        for f in ABLATION_GRID:
            for f1 in ABLATION_GRID:
                if f == f1 == 1.0:
                    continue  # the centre is the `mars` row
                lr, lr_1d = f"{centre['lr'] * f:g}", f"{centre['lr_1d'] * f1:g}"
                runs.append(TableRun(f"{folder}/lr-grid", f"-lr{lr}-lr1d{lr_1d}",
                                (f"optimizer.lr={lr}", f"optimizer.lr_1d={lr_1d}")))  # fmt: skip
    return runs


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def estimator(runs: list[TableRun], world: int):
    """micro-batch -> MemoryEstimate for these runs of one size (the largest optimizer state):
    trainer.memory_plan.experiment_estimator, which the GPU check shares."""
    from trainer.memory_plan import experiment_estimator

    return experiment_estimator([r.experiment for r in runs], world)
