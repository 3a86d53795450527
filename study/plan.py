"""What the study runs: cells (optimizer, model, budget), their tuned keys and grids, the seeds,
and where each run lives.

A budget is in tokens per block parameter (20 = 1x Chinchilla): ``tokens = 20 x budget x N``, N
the parameters of the transformer blocks (the proxies' ``non-embedding`` parameters: the token
and position embeddings left out), turned into ``max_steps`` at the study's global batch; the
warmup is a fixed fraction of each budget's steps, so each budget has its own full schedule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

CHINCHILLA = 20  # tokens per parameter at 1x
# Where each optimizer's tuning starts (the lr grid's center); the grid moves as far as it must.
CENTERS = {
    "adamw": {"optimizer.lr": 4e-3},
    "mars-adamw": {"optimizer.lr": 4e-3, "optimizer.lr_1d": 2e-3},
    "muon": {"optimizer.lr": 2e-2, "optimizer.adamw_lr": 4e-3},
    "mars-m": {"optimizer.lr": 4e-3},
    "moonlight": {"optimizer.lr": 4e-3},
    # the baselines of docs/optimizers.md: the same starting points as their nearest kin above
    "soap": {"optimizer.lr": 4e-3},
    "ademamix": {"optimizer.lr": 4e-3},
    "adamw-schedulefree": {"optimizer.lr": 4e-3},
    "normuon": {"optimizer.lr": 2e-2, "optimizer.adamw_lr": 4e-3},
    "mars-soap": {"optimizer.lr": 4e-3, "optimizer.lr_1d": 2e-3},
    "mars-ademamix": {"optimizer.lr": 4e-3, "optimizer.lr_1d": 2e-3},
}
DEFAULT_CENTER = {"optimizer.lr": 4e-3}
# MARS-AdamW's 1-D tensors (norm gains) and Muon's non-matrix tensors (embedding, head, gains) are
# on an AdamW of their own lr: tuned like the lr (coordinate descent, after it). MARS-M and
# Moonlight share one lr (their AdamW part's update is scaled to match Muon's RMS).
# Values every run of an optimizer gets (stated in the report): Muon trains only the blocks'
# matrices with Newton-Schulz (its recommended routing), the rest on its own AdamW.
# Schedule-Free AdamW replaces the decaying schedule (its averaging is the decay): the trainer's
# warmup, then a constant lr.
FIXED = {
    "muon": ["optimizer.routing=recommended"],
    "adamw-schedulefree": ["schedule=constant"],
}


TUNED = "tuned"  # a variant's value that tunes the key instead: ``adamw:aux_lr=tuned``


def _variant_pairs(name: str) -> tuple[str, list[tuple[str, str]]]:
    base, sep, rest = name.partition(":")
    pairs = [p for p in rest.split(",") if p]
    bad = [p for p in pairs if "=" not in p or not p.split("=", 1)[0]]
    if bad or (sep and not pairs):
        raise ValueError(f"optimizer {name!r}: write NAME or NAME:KEY=VALUE[,KEY=VALUE], e.g. "
                         "mars-soap:gamma=0 or adamw:aux_lr=tuned (KEY an option of "
                         "optimizer=NAME; the value tuned: the key is tuned like the lr)")  # fmt: skip
    return base, [tuple(p.split("=", 1)) for p in pairs]


def split_variant(name: str) -> tuple[str, list[str]]:
    """An optimizer of the study and its fixed options: ``"mars-soap:gamma=0"`` is the registered
    ``mars-soap`` with ``optimizer.gamma=0`` (an ablation cell); a plain name has none. A key
    whose value is ``tuned`` (``adamw:aux_lr=tuned``) is not fixed but tuned (variant_tuned)."""
    base, pairs = _variant_pairs(name)
    return base, [f"optimizer.{k}={v}" for k, v in pairs if v != TUNED]


def variant_tuned(name: str) -> list[str]:
    """The keys a variant tunes besides its optimizer's own: ``adamw:aux_lr=tuned`` ->
    ``["optimizer.aux_lr"]`` (AdamW with its own lr for the non-matrix parameters, tuned)."""
    return [f"optimizer.{k}" for k, v in _variant_pairs(name)[1] if v == TUNED]


def check_optimizer(name: str) -> None:
    """Refuse, before any run starts, an unregistered optimizer or a variant option its config
    does not have (else every run of that cell would fail and count as diverged)."""
    import dataclasses

    from optim import get_spec

    base, options = split_variant(name)
    fields = {f.name for f in dataclasses.fields(get_spec(base).config_cls)}
    unknown = [o.split("=", 1)[0].removeprefix("optimizer.") for o in options + variant_tuned(name)]
    unknown = [k for k in unknown if k not in fields]
    if unknown:
        raise ValueError(f"optimizer {name!r}: {base} has no option {', '.join(unknown)}; "
                         f"its options: {', '.join(sorted(fields))}")  # fmt: skip


def dir_name(name: str) -> str:
    """A variant's directory name: ``mars-soap:gamma=0`` -> ``mars-soap@gamma-0``."""
    return name.replace(":", "@").replace("=", "-").replace(",", "_")


def short(key: str) -> str:
    """``optimizer.adamw_lr`` -> ``adamw_lr``: the name in run directories and results.csv."""
    return key.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class Cell:
    optimizer: str
    model: str
    budget: float  # tokens per block parameter / 20

    @property
    def name(self) -> str:
        return f"{self.model}/{self.budget:g}x/{self.optimizer}"


@dataclass
class Plan:
    out: Path
    optimizers: list[str]
    models: list[str]
    budgets: list[float]
    reference: str = "adamw"
    reference_budgets: list[float] = field(default_factory=lambda: [2.0, 4.0])  # x each budget
    select_seed: int = 0
    eval_seeds: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5])
    batch_tokens: int = 2048
    warmup_frac: float = 0.1
    tune: list[str] = field(default_factory=list)  # extra keys for coordinate descent
    extra: list[str] = field(default_factory=list)  # overrides for every run
    # grid centers replacing CENTERS: {optimizer: {key: value}} (--center OPT:KEY=VALUE)
    centers: dict[str, dict[str, float]] = field(default_factory=dict)
    # optimizers run at their centers without tuning (--untuned: ablations at a tuned cell's
    # values, e.g. mars-soap:gamma=0 at mars-soap's chosen lrs)
    untuned: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.select_seed in self.eval_seeds:
            raise ValueError(
                f"the selection seed {self.select_seed} is among the evaluation seeds "
                f"{self.eval_seeds}: evaluation seeds must be fresh; choose another --select-seed"
            )
        for opt in self.optimizers:
            check_optimizer(opt)
        for opt in self.untuned:
            if opt not in self.optimizers:
                raise ValueError(f"--untuned {opt}: not among --optimizers {self.optimizers}")
            missing = [
                k for k in self.keys(Cell(opt, "", 1.0)) if k not in self.centers.get(opt, {})
            ]
            if missing:
                raise ValueError(f"--untuned {opt}: give its values with --center "
                                 + " ".join(f"{opt}:{k}=VALUE" for k in missing))  # fmt: skip
        for opt, given in self.centers.items():
            unknown = set(given) - set(self.keys(Cell(opt, "", 1.0)))
            if opt not in self.optimizers or unknown:
                raise ValueError(
                    f"--center {opt}:{','.join(sorted(unknown)) or '...'}: not a tuned key of an "
                    f"optimizer of this study (tuned: "
                    + "; ".join(
                        f"{o}: {', '.join(self.keys(Cell(o, '', 1.0)))}" for o in self.optimizers
                    )
                    + ")"
                )
        if len(self.eval_seeds) < 2:
            raise ValueError("at least 2 evaluation seeds are needed for an interval (5 advised)")

    def cells(self) -> list[Cell]:
        """Every cell, the main budgets first (all optimizers), then the reference's extra
        budgets, cheapest first: an interrupted study has the comparisons before the speedups."""
        main = [Cell(o, m, b) for m in self.models for b in self.budgets for o in self.optimizers]
        extra = sorted(
            {b * r for b in self.budgets for r in self.reference_budgets} - set(self.budgets)
        )
        ref = [Cell(self.reference, m, b) for b in extra for m in self.models]
        return main + ref

    def keys(self, cell: Cell) -> list[str]:
        """The keys tuned for ``cell``, in coordinate-descent order: the lr first."""
        own = list(CENTERS.get(split_variant(cell.optimizer)[0], DEFAULT_CENTER))
        own += [k for k in variant_tuned(cell.optimizer) if k not in own]
        return own + [k for k in self.tune if k not in own]

    def center(self, cell: Cell, key: str) -> float:
        given = self.centers.get(cell.optimizer, {})
        if key in given:
            return given[key]
        centers = CENTERS.get(split_variant(cell.optimizer)[0], DEFAULT_CENTER)
        if key not in centers and key.endswith("lr") and key in variant_tuned(cell.optimizer):
            key = "optimizer.lr"  # a variant's own lr (aux_lr) starts where the lr does
        return given.get(key, centers.get(key, 1.0))

    def cell_dir(self, cell: Cell) -> Path:
        return self.out / "runs" / cell.model / f"{cell.budget:g}x" / dir_name(cell.optimizer)

    def run_dir(self, cell: Cell, role: str, values: dict[str, float], seed: int) -> Path:
        parts = [f"{short(k)}-{values[k]!r}" for k in sorted(values)] + [f"seed-{seed}"]
        return self.cell_dir(cell) / role / "_".join(parts)


def block_params(model: str) -> int:
    """Parameters in ``model``'s transformer blocks and final norm (configs/model/<model>.yaml):
    the study's N, everything but the token and position embeddings."""
    import torch

    from model import build_model

    with torch.device("meta"):
        m = build_model(model_config(model))
    embeddings = {"transformer.wte.weight", "transformer.wpe.weight", "tok_embeddings.weight"}
    return sum(p.numel() for n, p in m.named_parameters() if n not in embeddings)


def budget_steps(n_params: int, budget: float, batch_tokens: int) -> int:
    """``max_steps`` for ``budget`` x 20 tokens per parameter at ``batch_tokens`` a step."""
    return max(1, math.ceil(CHINCHILLA * budget * n_params / batch_tokens))


def model_config(name: str):  # noqa: ANN201 - a ModelConfig
    """configs/model/<name>.yaml as a ModelConfig (the presets have no defaults list, so plain
    YAML: no Hydra composition, which takes seconds)."""
    import yaml

    from model import ModelConfig

    path = Path(__file__).resolve().parent.parent / "configs" / "model" / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown model {name!r}: no {path}; choose one of configs/model/")
    return ModelConfig(**yaml.safe_load(path.read_text()))
