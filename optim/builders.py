"""Typed configs and builders of the registered optimizers other than AdamW.

Defaults are the papers' GPT-2 small values (docs/reproduction.md, "2.2 Per optimizer and
size"); every knob where ports of MARS disagree is a field whose default is the official code's
behaviour (docs/official-code.md).
Routing (which tensors each update rule gets) uses the parameter kinds of optim/groups.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import ClassVar

import torch
import torch.nn as nn

from optim.core import VarianceReduced
from optim.groups import classify_parameters, decay_groups, split_aux
from optim.lion import Lion
from optim.mars import mars_rule
from optim.muon import MuonFamily, adamw_group, muon_group
from optim.options import check_fields, choice
from optim.preconditioners import PRECONDITIONERS
from optim.registry import register
from optim.rule import Rule

PREFIX = "optimizer."  # config errors name the full key (optimizer.lr)
# Every registered optimizer's second lr, one meaning everywhere (docs/optimizers.md): the peak lr
# of every parameter that is not a block matrix (embedding = tied head, untied head, positions,
# gains, biases), whatever rule it is on; None: the optimizer's own lrs, unchanged.


@dataclass
class MarsConfig:
    """What MARS-AdamW, -Lion and -Shampoo share (GPT-2 small: lr 6e-3, lr_1d 3e-3, wd 0.01,
    betas (0.95, 0.99), gamma 0.025; docs/reproduction.md, "2.2 Per optimizer and size")."""

    name: str = "mars-adamw"
    mode: str = "approx"  # approx: g_ref = last step's gradient; exact: two gradients per step
    lr: float = 6e-3
    betas: list[float] = field(default_factory=lambda: [0.95, 0.99])
    eps: float = 1e-8
    weight_decay: float = 0.01
    decay_kinds: list[str] = field(default_factory=lambda: ["matrix"])  # official: Linear only
    gamma: float = 0.025
    # gamma per step (optim/schedules.py): constant | linear | cosine, from gamma to gamma_end
    # over the lr schedule's horizon (schedule.decay_steps, else max_steps)
    gamma_schedule: str = "constant"
    gamma_end: float = 0.0
    optimize_1d: bool = False  # False: non-2-D tensors on the AdamW fallback (official)
    lr_1d: float = 3e-3
    betas_1d: list[float] = field(default_factory=lambda: [0.9, 0.95])
    weight_decay_1d: float = 0.1  # the fallback's decay, whatever the tensor's group (official)
    # Set: the embeddings/head (on the MARS rule) and the non-2-D tensors (on the fallback, in
    # place of lr_1d, which is then not read) at this peak lr; None: lr and lr_1d as above.
    aux_lr: float | None = None
    clip: str = "tensor"  # tensor (official) | global (levanter) | none
    first_step: str = "zero"  # zero: g_ref = 0, c_1 = (1+kappa) g_1 (official) | plain: c_1 = g_1
    foreach: bool | None = None  # None/true: torch._foreach ops; false: the per-tensor loop
    fused: bool | None = None  # compiled element-wise step (optim/fused.py); None: on CUDA only

    preconditioner: ClassVar[str] = "adam"  # a registered preconditioner (optim/preconditioners)
    fixed_options: ClassVar[dict] = {}  # its options that are not config fields
    # the class build_mars makes: the core or a subclass of it (its own ``correction``; config
    # fields named in its ``adapter_keys`` become group keys); docs/adding-an-optimizer.md
    optimizer_class: ClassVar[type] = VarianceReduced

    def __post_init__(self) -> None:
        check_fields(self, PREFIX)
        if self.gamma_schedule == "constant" and self.gamma_end != 0.0:
            raise ValueError(
                f"{PREFIX}gamma_end={self.gamma_end} is read only by a gamma schedule: set "
                f"{PREFIX}gamma_schedule=linear (or cosine), or leave gamma_end out"
            )
        self.rule()  # the rule's own checks (every value is valid by now)

    def rule(self) -> Rule:
        """The MARS rule of this config: its preconditioner's options are the fields it has."""
        options_cls = PRECONDITIONERS[self.preconditioner].Options
        names = {f.name for f in fields(options_cls)} & {f.name for f in fields(self)}
        options = options_cls(**{n: getattr(self, n) for n in names}, **self.fixed_options)
        return mars_rule(self.preconditioner, options, gamma=self.gamma, clip=self.clip,
                         first_step=self.first_step, optimize_1d=self.optimize_1d, lr=self.lr,
                         lr_1d=self.lr_1d, betas_1d=self.betas_1d,
                         weight_decay_1d=self.weight_decay_1d)  # fmt: skip


@dataclass
class MarsAdamWConfig(MarsConfig):
    """MARS-AdamW: the Adam preconditioner on the MARS momentum."""

    amsgrad: bool = False
    second_moment: str = "c"  # c: v from the clipped c (official code) | g: raw gradient (paper)


@dataclass
class MarsLionConfig(MarsConfig):
    """MARS-Lion: sign of the MARS momentum. The official repo publishes no tuned GPT-2 values;
    the lr follows Lion's rule of thumb (about AdamW's / 3)."""

    name: str = "mars-lion"
    lr: float = 2e-4

    preconditioner: ClassVar[str] = "sign"


@dataclass
class MarsShampooConfig(MarsConfig):
    """MARS-Shampoo: Newton-Schulz of the MARS momentum. No tuned GPT-2 values are published;
    the lr is the Muon baseline's (same update scale sqrt(max(1, rows/cols))). With
    ``optimize_1d`` its non-2-D tensors take the mars-adamw rule at the official defaults."""

    name: str = "mars-shampoo"
    lr: float = 2e-2
    ns_steps: int = 5
    ns_dtype: str = "bfloat16"  # Newton-Schulz precision ("param": as p)
    ns_distributed: bool = True  # under DDP each rank orthogonalises a share, then all-gather

    preconditioner: ClassVar[str] = "newton-schulz"
    fixed_options: ClassVar[dict] = {"ns_debias": True}  # NS5(m / (1 - beta1)), as the official


def forward(cfg, *skip: str) -> dict:
    """The config's fields as keyword arguments (lists as tuples), less ``name`` and ``skip``."""
    out = {}
    for f in fields(cfg):
        if f.name not in ("name", *skip):
            value = getattr(cfg, f.name)
            out[f.name] = tuple(value) if isinstance(value, list) else value
    return out


def build_mars(model: nn.Module, cfg: MarsConfig, *, cls: type | None = None,
               ) -> torch.optim.Optimizer:  # fmt: skip
    """Any MARS config: its rule (``cfg.rule()``) on ``cls`` (default ``cfg.optimizer_class``:
    the core or a subclass of it), decay on ``decay_kinds``; the config's fields named in the
    class's ``adapter_keys`` become group keys, and ``gamma_schedule`` the group's schedule."""
    cls = cls or cfg.optimizer_class
    rule = cfg.rule()
    if not (isinstance(cls, type) and issubclass(cls, VarianceReduced)):
        raise TypeError(f"build_mars builds a subclass of optim.VarianceReduced, got {cls!r}")
    # eps in every group: the non-2-D tensors' Adam reads it whatever the preconditioner
    defaults = {"lr": cfg.lr, "betas": tuple(cfg.betas), "weight_decay": cfg.weight_decay,
                "eps": cfg.eps, **rule.group_keys()}  # fmt: skip
    defaults.update({k: v for k, v in forward(cfg).items() if k in cls.adapter_keys})
    if cfg.gamma_schedule != "constant":
        defaults["schedules"] = {"gamma": (cfg.gamma_schedule, cfg.gamma, cfg.gamma_end)}
    # aux_lr: the fallback's lr is lr * lr_1d_factor, so a factor of 1 puts it at aux_lr too
    groups = split_aux(model, decay_groups(model, cfg.weight_decay, cfg.decay_kinds), cfg.aux_lr,
                       **({"lr_1d_factor": 1.0} if rule.split_1d else {}))  # fmt: skip
    return cls(groups, defaults, is_approx=cfg.mode == "approx", foreach=cfg.foreach,
               fused=cfg.fused)  # fmt: skip


register("mars-adamw", MarsAdamWConfig, "MARS with the AdamW preconditioner")(build_mars)
register("mars-lion", MarsLionConfig, "MARS with the sign (Lion) update")(build_mars)
register("mars-shampoo", MarsShampooConfig, "MARS with Newton-Schulz orthogonalisation")(
    build_mars
)


@dataclass
class MuonLikeConfig:
    """What Moonlight, MARS-M and MARS-M-Efficient share: block matrices on the Newton-Schulz
    rule (scale 0.2*sqrt(max(A, B))); embeddings, head and gains on AdamW with the same lr, wd."""

    name: str = "moonlight"
    lr: float = 6e-3
    weight_decay: float = 0.1
    momentum: float = 0.95
    ns_steps: int = 5
    ns_dtype: str = "bfloat16"
    ns_distributed: bool = True  # under DDP each rank orthogonalises a share, then all-gather
    adamw_betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    adamw_eps: float = 1e-8
    fused: bool | None = None  # compiled element-wise step (optim/fused.py); None: on CUDA only
    aux_lr: float | None = None  # set: the AdamW part's lr (embeddings, head, gains); None: lr

    def __post_init__(self) -> None:
        check_fields(self, PREFIX)


@dataclass
class MoonlightConfig(MuonLikeConfig):
    """Moonlight's Muon (GPT-2 small: lr 6e-3, wd 0.1, Nesterov momentum 0.95)."""

    nesterov: bool = True


@dataclass
class MarsMEfficientConfig(MuonLikeConfig):
    """MARS-M in one buffer per matrix: approx MARS-M without clipping (no exact mode)."""

    name: str = "mars-m-efficient"
    weight_decay: float = 0.01
    gamma: float = 0.025


@dataclass
class MarsMConfig(MarsMEfficientConfig):
    """MARS-M (GPT-2 small: lr 6e-3, wd 0.01 as the official configs, momentum 0.95, gamma
    0.025). ``nesterov`` is recorded to say what the official code does (an EMA momentum, no
    Nesterov) and must stay false."""

    name: str = "mars-m"
    weight_decay: float = 0.01  # the official configs; the MARS-M README says 0.1
    mode: str = "approx"
    nesterov: bool = False
    clip: str = "tensor"  # tensor (official) | global | none
    first_step: str = "zero"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.nesterov:
            raise ValueError("optimizer.nesterov=true: MARS-M's momentum is an EMA; use false")


def _split(model: nn.Module, muon_kinds: tuple[str, ...]) -> tuple[list, list]:
    kinds = classify_parameters(model)
    muon = [p for k in muon_kinds for _, p in kinds[k]]
    rest = [p for k, ps in kinds.items() if k not in muon_kinds for _, p in ps]
    return muon, rest


def _moonlight_like(model: nn.Module, cfg: MuonLikeConfig, algorithm: str, **options):
    """Block matrices on the Muon-style rule, the rest on AdamW with the same lr and wd."""
    muon, rest = _split(model, ("matrix",))
    common = dict(lr=cfg.lr, weight_decay=cfg.weight_decay)
    muon_keys = forward(cfg, "lr", "weight_decay", "adamw_betas", "adamw_eps", "mode", "fused",
                        "aux_lr")  # fmt: skip
    groups = [
        muon_group(muon, algorithm=algorithm, scale="rms", **common, **muon_keys, **options),
        adamw_group(rest, betas=cfg.adamw_betas, eps=cfg.adamw_eps, **common),
    ]
    return MuonFamily(
        split_aux(model, groups, cfg.aux_lr),
        is_approx=getattr(cfg, "mode", "approx") == "approx",
        fused=cfg.fused,
    )


@register("mars-m", MarsMConfig, "MARS correction in front of Moonlight's Muon")
def _build_mars_m(model: nn.Module, cfg: MarsMConfig) -> torch.optim.Optimizer:
    return _moonlight_like(model, cfg, "mars-m")


@register("mars-m-efficient", MarsMEfficientConfig, "MARS-M, one buffer, no clipping")
def _build_mars_m_efficient(model: nn.Module, cfg: MarsMEfficientConfig):
    return _moonlight_like(model, cfg, "mars-m-efficient", nesterov=False, clip="none")


@register("moonlight", MoonlightConfig, "Moonlight's Muon: Nesterov, 0.2*sqrt(max(A,B)) scale")
def _build_moonlight(model: nn.Module, cfg: MoonlightConfig) -> torch.optim.Optimizer:
    return _moonlight_like(model, cfg, "muon")


# mars-repo: the MARS repo's CombinedOptimizer puts every tensor with ndim >= 2 on Muon, so an
# untied head (2-D) goes there too; recommended: Keller Jordan's block matrices only.
MUON_ROUTINGS = {
    "mars-repo": ("matrix", "embedding", "head", "other"),
    "recommended": ("matrix",),
}
choice("routing", MUON_ROUTINGS)


@dataclass
class MuonConfig:
    """Muon (GPT-2 small in the MARS repo: lr 2e-2, wd 0; its AdamW part lr 3e-3, wd 0.1)."""

    name: str = "muon"
    routing: str = "mars-repo"  # mars-repo: every >=2-D tensor incl. embeddings | recommended
    # shape: sqrt(max(1, rows/cols)) (Muon); rms: 0.2*sqrt(max(rows, cols)), which with a
    # weight_decay is the EPFL benchmark's D-Muon (Muon with decoupled weight decay, Moonlight's
    # update RMS): optimizer.scale=rms optimizer.weight_decay=0.1 optimizer.routing=recommended
    scale: str = "shape"
    lr: float = 2e-2
    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    ns_dtype: str = "bfloat16"
    ns_distributed: bool = True  # under DDP each rank orthogonalises a share, then all-gather
    weight_decay: float = 0.0
    adamw_lr: float = 3e-3
    adamw_betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    adamw_eps: float = 1e-8
    adamw_weight_decay: float = 0.1
    adamw_decay_bias_corrected: bool = True  # the MARS repo's AdamW scales decay by its bias factor
    fused: bool | None = None  # compiled element-wise step (optim/fused.py); None: on CUDA only
    # Set: the peak lr of every non-matrix parameter, taking precedence over adamw_lr (the AdamW
    # part's lr, then not read); under routing=mars-repo the embeddings/head stay on Newton-Schulz
    # (a group of their own) at this lr. None: adamw_lr, and lr for what is on Newton-Schulz.
    aux_lr: float | None = None

    def __post_init__(self) -> None:
        check_fields(self, PREFIX)


@register("muon", MuonConfig, "Muon: Nesterov momentum, Newton-Schulz, sqrt(max(1, r/c)) scale")
def _build_muon(model: nn.Module, cfg: MuonConfig) -> torch.optim.Optimizer:
    muon, rest = _split(model, MUON_ROUTINGS[cfg.routing])
    if cfg.routing == "mars-repo":  # Newton-Schulz takes the 2-D tensors; the rest stay on AdamW
        rest += [p for p in muon if p.ndim != 2]
        muon = [p for p in muon if p.ndim == 2]
    groups = [
        muon_group(
            muon,
            lr=cfg.lr,
            weight_decay=cfg.weight_decay,
            momentum=cfg.momentum,
            nesterov=cfg.nesterov,
            ns_steps=cfg.ns_steps,
            ns_dtype=cfg.ns_dtype,
            ns_distributed=cfg.ns_distributed,
            scale=cfg.scale,
        ),
        adamw_group(
            rest,
            lr=cfg.adamw_lr,
            weight_decay=cfg.adamw_weight_decay,
            betas=cfg.adamw_betas,
            eps=cfg.adamw_eps,
            bias_corrected=cfg.adamw_decay_bias_corrected,
        ),
    ]
    return MuonFamily(split_aux(model, groups, cfg.aux_lr), fused=cfg.fused)


@dataclass
class LionConfig:
    """Lion. Not in the MARS papers' tables; defaults follow the Lion paper's advice relative to
    AdamW's GPT-2 small values (lr / 3, weight decay x 3, betas (0.9, 0.99))."""

    name: str = "lion"
    lr: float = 2e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    weight_decay: float = 0.3
    decay_kinds: list[str] = field(default_factory=lambda: ["matrix"])
    fused: bool | None = None  # compiled element-wise step (optim/fused.py); None: on CUDA only
    aux_lr: float | None = None  # set: every non-matrix parameter's peak lr; None: lr

    def __post_init__(self) -> None:
        check_fields(self, PREFIX)


@register("lion", LionConfig, "Lion: sign of interpolated momentum")
def _build_lion(model: nn.Module, cfg: LionConfig) -> torch.optim.Optimizer:
    groups = split_aux(model, decay_groups(model, cfg.weight_decay, cfg.decay_kinds), cfg.aux_lr)
    return Lion(groups, lr=cfg.lr, betas=tuple(cfg.betas), fused=cfg.fused)
