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

from study.knobs import DEFAULT_KNOBS, KNOBS, default
from study.variant import Variant

CHINCHILLA = 20  # tokens per parameter at 1x
OPTIMIZERS = ["adamw", "mars-adamw", "muon", "mars-m", "moonlight"]  # a study's by default
# Where each optimizer's lr search starts (the other knobs start at the optimizer's own defaults,
# study/knobs.py ``default``); the search moves as far as it must.
CENTERS = {
    "adamw": {"lr": 4e-3},
    "mars-adamw": {"lr": 4e-3, "aux_lr": 2e-3},
    "muon": {"lr": 1.6e-2, "aux_lr": 4e-3},
    "mars-m": {"lr": 4e-3},
    "moonlight": {"lr": 4e-3},
    # the baselines of docs/optimizers.md: the same starting points as their nearest kin above
    "soap": {"lr": 4e-3},
    "ademamix": {"lr": 4e-3},
    "adamw-schedulefree": {"lr": 4e-3},
    "normuon": {"lr": 1.6e-2, "aux_lr": 4e-3},
    "mars-soap": {"lr": 4e-3, "aux_lr": 2e-3},
    "mars-ademamix": {"lr": 4e-3, "aux_lr": 2e-3},
}
DEFAULT_CENTER = {"lr": 4e-3}
# Values every run of an optimizer gets (stated in the report): Muon trains only the blocks'
# matrices with Newton-Schulz (its recommended routing), the rest on its own AdamW.
# Schedule-Free AdamW replaces the decaying schedule (its averaging is the decay): the trainer's
# warmup, then a constant lr.
FIXED = {
    "muon": ["optimizer.routing=recommended"],
    "adamw-schedulefree": ["schedule=constant"],
}
# The config fields each knob sets (a variant that fixes one of them fixes the knob).
KNOB_FIELDS = {
    "lr": ("optimizer.lr",), "aux_lr": ("optimizer.aux_lr",), "wd": ("optimizer.weight_decay",),
    "beta2": ("optimizer.betas", "optimizer.momentum"), "warmup": ("schedule.warmup_steps",),
}  # fmt: skip


def split_variant(name: str) -> tuple[str, list[str]]:
    """An optimizer of the study and its fixed overrides (``Variant.parse(name).overrides``):
    ``"mars-soap:gamma=0"`` -> ``("mars-soap", ["optimizer.gamma=0"])``."""
    variant = Variant.parse(name)
    return variant.base, variant.overrides


def variant_tuned(name: str) -> list[str]:
    """The keys a variant tunes besides the study's knobs: ``adamw:eps=tuned`` -> ``["eps"]``
    (``adamw:aux_lr=tuned``, a knob, is tuned whether or not the study tunes aux_lr)."""
    return list(Variant.parse(name).tuned)


def check_optimizer(name: str) -> None:
    """Refuse, before any run starts, an unregistered optimizer or a variant option its config
    does not have (else every run of that cell would fail and count as diverged)."""
    import dataclasses

    from optim import get_spec

    variant = Variant.parse(name)
    fields = {f.name for f in dataclasses.fields(get_spec(variant.base).config_cls)}
    keys = [k for k, _ in variant.fixed] + list(variant.tuned)
    unknown = [k for k in keys if k not in fields and k not in KNOBS]
    if unknown:
        raise ValueError(f"optimizer {name!r}: {variant.base} has no option "
                         f"{', '.join(unknown)}; its options: {', '.join(sorted(fields))}")  # fmt: skip


def dir_name(name: str) -> str:
    """A variant's directory name: ``mars-soap:gamma=0`` -> ``mars-soap@gamma-0``."""
    return Variant.parse(name).dir_name


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
    """A study: what it runs and how. A part of a study's definition builds it
    (study/definition.py ``plan_of``), and so does the flag command (study/cli.py, a one-part
    definition); each field's default here is the command's default."""

    out: Path = Path("runs/study")
    optimizers: list[str] = field(default_factory=lambda: list(OPTIMIZERS))
    models: list[str] = field(default_factory=lambda: ["proxy-100k"])
    budgets: list[float] = field(default_factory=lambda: [1.0])  # x Chinchilla
    baseline: str = "adamw"
    baseline_budgets: list[float] = field(default_factory=lambda: [2.0, 4.0])  # x each budget
    # seeds that choose (by the mean over them) and seeds that evaluate: disjoint, and the same
    # for every optimizer (a seed fixes the initial weights and the data order)
    select_seeds: list[int] = field(default_factory=lambda: [0, 6, 7])
    eval_seeds: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5])
    batch_tokens: int = 2048
    warmup_frac: float = 0.1  # when warmup is neither tuned nor given
    knobs: list[str] = field(default_factory=lambda: list(DEFAULT_KNOBS))  # tuned, in order
    extra: list[str] = field(default_factory=list)  # overrides for every run
    # starting (tuned knobs) or fixed (other knobs) values: {optimizer: {knob: value}}
    centers: dict[str, dict[str, float]] = field(default_factory=dict)
    # optimizers run at their centers without tuning (--untuned: ablations at a tuned cell's
    # values, e.g. mars-soap:gamma=0 at mars-soap's chosen values)
    untuned: list[str] = field(default_factory=list)
    finalists: int = 3  # values of a line that run on every selection seed
    max_passes: int = 3  # coordinate descent's passes at most (a cap, flagged)
    cap: int = 9  # values per line at most (a cap, flagged)
    swap: bool = True  # the final lr line's finalists also on the evaluation seeds
    evals: int = 2  # validation evaluations per run (the last at the end)
    # knobs the baseline's extra budgets tune; the rest carried from its main budget
    baseline_knobs: tuple[str, ...] = ("lr", "aux_lr")
    # every optimizer's knobs start at (or are fixed to) the values another study chose: its
    # results.csv, at the cell MODEL:BUDGET (None: the file's only one), read into ``carried``
    # (study/definition.py plan_of); ``centers`` win over them
    center_from: Path | None = None
    center_cell: str | None = None
    carried: dict[str, dict[str, float]] = field(default_factory=dict)
    # the report: other studies' results.csv, whose cells this study lacks join its results
    # (only ``merge_only``'s optimizers' where given); a final loss at or above
    # ``collapse_floor`` is a collapse (None: the validation split's bigram loss)
    merge: list[Path] = field(default_factory=list)
    merge_only: list[str] | None = None
    collapse_floor: float | None = None
    bootstrap: bool = False  # bootstrap intervals over pairs
    # how it runs, not what: no run id or value depends on these
    jobs: int = 2  # commands at a time on this machine
    threads: int = 1  # CPU threads per command
    nproc: int = 1  # processes per run (torchrun, GPUs)
    device: str | None = None  # train.py's device for every run (before ``extra``)
    launcher: str = "local"
    report_only: bool = False
    dry_run: bool = False
    allow_dirty: bool = False
    # the starting (or fixed) values in use: ``center_from``'s, ``centers`` over them
    start_values: dict[str, dict[str, float]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.budgets = [float(b) for b in self.budgets]
        self.baseline_budgets = [float(b) for b in self.baseline_budgets]
        self.centers = {o: {short(k): float(v) for k, v in c.items()}
                        for o, c in self.centers.items()}  # fmt: skip
        self._check_numbers()
        self.start_values = {o: dict(c) for o, c in self.carried.items()}
        for opt, given in self.centers.items():
            self.start_values.setdefault(opt, {}).update(given)
        both = sorted(set(self.select_seeds) & set(self.eval_seeds))
        if both:
            raise ValueError(
                f"seeds {both} are both selection and evaluation seeds: evaluation seeds must "
                "be fresh; make --select-seeds and --eval-seeds disjoint"
            )
        if not self.select_seeds:
            raise ValueError("--select-seeds: at least one seed (3 or more advised)")
        bad = [k for k in self.knobs if k not in KNOBS]
        if bad:
            raise ValueError(f"--knobs {' '.join(bad)}: unknown; knobs: {', '.join(KNOBS)}")
        for opt in self.optimizers:
            check_optimizer(opt)
        for opt in self.untuned:
            if opt not in self.optimizers:
                raise ValueError(f"--untuned {opt}: not among --optimizers {self.optimizers}")
            missing = [k for k in ("lr", *Variant.parse(opt).tuned)
                       if k not in self.start_values.get(opt, {})]  # fmt: skip
            if missing:
                raise ValueError(f"--untuned {opt}: give its values with --center "
                                 + " ".join(f"{opt}:{k}=VALUE" for k in missing))  # fmt: skip
        for opt, given in self.start_values.items():
            allowed = set(KNOBS) | set(Variant.parse(opt).tuned)
            unknown = set(given) - allowed
            if opt not in self.optimizers or unknown:
                raise ValueError(
                    f"--center {opt}:{','.join(sorted(unknown)) or '...'}: not a knob of an "
                    f"optimizer of this study (knobs: {', '.join(KNOBS)}; optimizers: "
                    f"{', '.join(self.optimizers)})"
                )
        if len(self.eval_seeds) < 2:
            raise ValueError("at least 2 evaluation seeds are needed for an interval (5 advised)")

    def _check_numbers(self) -> None:
        """A value the study cannot run with, refused in one line before anything is written."""
        for name, values in (("--budgets", self.budgets),
                             ("--baseline-budgets", self.baseline_budgets)):  # fmt: skip
            bad = [v for v in values if not (math.isfinite(v) and v > 0)]
            if bad:
                raise ValueError(f"{name} {bad[0]:g}: budgets are positive numbers of x "
                                 "Chinchilla (1 = 20 tokens per block parameter)")  # fmt: skip
        for name in ("jobs", "threads", "nproc", "batch_tokens", "finalists", "max_passes",
                     "evals"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)}: at least 1")
        if self.collapse_floor is not None and not math.isfinite(self.collapse_floor):
            raise ValueError(f"--collapse-floor {self.collapse_floor}: a finite loss")

    def check_files(self) -> None:
        """The folder, the merged ledgers and the models it names exist (one line each)."""
        if self.out.exists() and not self.out.is_dir():
            raise ValueError(f"--out {self.out}: a file is there; give a folder (new or a "
                             "study's)")  # fmt: skip
        for path in self.merge:
            head = path.read_text(errors="replace").split("\n", 1)[0] if path.is_file() else ""
            if not path.is_file() or "optimizer" not in head.split(","):
                raise ValueError(f"--merge {path}: not a study's results.csv (no such file, or "
                                 "no optimizer column)")  # fmt: skip
        for model in self.models:
            model_config(model)  # an unknown model: one line naming the known ones

    @property
    def train_overrides(self) -> list[str]:
        """The train.py overrides every run gets: the device, then ``extra``."""
        return [f"device={self.device}"] * (self.device is not None) + list(self.extra)

    def cells(self) -> list[Cell]:
        """Every cell, the main budgets first (all optimizers), then the baseline's extra
        budgets, cheapest first: an interrupted study has the comparisons before the speedups."""
        main = [Cell(o, m, b) for m in self.models for b in self.budgets for o in self.optimizers]
        extra = sorted(
            {b * r for b in self.budgets for r in self.baseline_budgets} - set(self.budgets)
        )
        ref = [Cell(self.baseline, m, b) for b in extra for m in self.models]
        return main + ref

    def is_main(self, cell: Cell) -> bool:
        return cell.budget in self.budgets

    def keys(self, cell: Cell) -> list[str]:
        """The keys tuned for ``cell``, in coordinate-descent order: the lr first; a knob whose
        config field a variant fixes (``mars-adamw:betas=[0.9,0.95]`` fixes beta2) is not."""
        fixed = Variant.parse(cell.optimizer).override_keys
        return [k for k in self._keys(cell) if not fixed & set(KNOB_FIELDS.get(k, ()))]

    def _keys(self, cell: Cell) -> list[str]:
        if cell.optimizer in self.untuned:
            own = list(self.start_values.get(cell.optimizer, {}))
            return [k for k in KNOBS if k in own] + [k for k in own if k not in KNOBS]
        knobs = self.knobs if self.is_main(cell) else [
            k for k in self.knobs if k in self.baseline_knobs]  # fmt: skip
        extra = [k for k in Variant.parse(cell.optimizer).tuned if k not in knobs]
        if "aux_lr" in extra:  # adamw:aux_lr=tuned in a study that does not tune aux_lr
            extra.remove("aux_lr")
            knobs = [*knobs, "aux_lr"]
        order = [k for k in KNOBS if k in knobs]
        return order + extra

    def center(self, cell: Cell, key: str) -> float:
        """Where ``key``'s search starts for ``cell`` (or its fixed value)."""
        given = self.start_values.get(cell.optimizer, {})
        if key in given:
            return given[key]
        base = Variant.parse(cell.optimizer).base
        centers = CENTERS.get(base, DEFAULT_CENTER)
        if key in centers:
            return centers[key]
        lr = given.get("lr", centers["lr"])
        if key in KNOBS:
            return default(base, key, lr)
        return 1.0  # a variant's own tuned key that is not a knob: give a --center

    def fixed_knobs(self, cell: Cell) -> dict[str, float]:
        """Knobs not tuned in ``cell`` that --center sets (the rest keep their defaults)."""
        given = self.start_values.get(cell.optimizer, {})
        fixed = Variant.parse(cell.optimizer).override_keys
        return {k: v for k, v in given.items() if k not in self.keys(cell)
                and not fixed & set(KNOB_FIELDS.get(k, ()))}  # fmt: skip

    def cell_dir(self, cell: Cell) -> Path:
        name = Variant.parse(cell.optimizer).dir_name
        return self.out / "runs" / cell.model / f"{cell.budget:g}x" / name

    def run_dir(self, cell: Cell, role: str, values: dict[str, float], seed: int) -> Path:
        """``.../select/lr-0.004_aux_lr-0.002_wd-0.1_beta2-0.95_warmup-0.1_seed-0``: the tuned
        values in the cell's key order, then the seed."""
        parts = [f"{k}-{values[k]!r}" for k in self.keys(cell)] + [f"seed-{seed}"]
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
    """configs/model/<name>.yaml as a ModelConfig, read by the one reader of configs/ outside
    Hydra (runtime/config_files.py; Hydra's composition takes seconds)."""
    from model import ModelConfig
    from runtime.config_files import config_names, load_config

    if name not in config_names("model"):
        raise ValueError(f"unknown model {name!r}: choose one of configs/model/: "
                         f"{', '.join(config_names('model'))}")  # fmt: skip
    return ModelConfig(**load_config(f"model/{name}"))
