"""Typed configs and builders of the newer baselines (issue 29) and their MARS versions.

- ``soap`` / ``mars-soap``: SOAP (optim/soap.py) on the core, without / with the MARS correction;
- ``ademamix`` / ``mars-ademamix``: AdEMAMix (optim/ademamix.py), likewise;
- ``normuon``: NorMuon (optim/normuon.py) on the hidden matrices, its auxiliary Adam on the rest;
- ``adamw-schedulefree``: Schedule-Free AdamW (optim/schedulefree.py), its own optimizer class.

Each default says where it comes from. Routing: ``soap``, ``ademamix`` and
``adamw-schedulefree`` update every tensor with their rule (as their references and papers do;
SOAP leaves dimensions above ``max_precond_dim``, GPT-2's vocabulary, unrotated and runs plain
Adam on 1-D tensors), decay on ``decay_kinds`` (block matrices, as the AdamW baseline).
``mars-soap`` and ``mars-ademamix`` take MARS's official routing: 2-D tensors (embeddings
included) on the MARS rule, the rest on AdamW with ``lr_1d``, ``betas_1d``, ``weight_decay_1d``.
``normuon`` puts the block matrices on NorMuon and embeddings, head and gains on Adam, as the
reference's README (Muon's) asks.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import ClassVar

import torch
import torch.nn as nn

from optim import ademamix as _ademamix  # noqa: F401  (registers the "ademamix" preconditioner)
from optim import normuon as _normuon  # noqa: F401  (registers "normuon" and "ema-nesterov")
from optim import soap as _soap  # noqa: F401  (registers the "soap" preconditioner)
from optim.builders import PREFIX, MarsConfig, _split, build_mars
from optim.core import VarianceReduced
from optim.groups import decay_groups, split_aux
from optim.options import check_fields
from optim.preconditioners import PRECONDITIONERS, AdamOptions
from optim.registry import register
from optim.rule import Rule
from optim.schedulefree import AdamWScheduleFree
from optim.sharded import is_sharded


def _options(cfg, preconditioner: str):
    """The preconditioner's Options from the config fields of the same names."""
    cls = PRECONDITIONERS[preconditioner].Options
    names = {f.name for f in fields(cls)} & {f.name for f in fields(cfg)}
    return cls(**{n: getattr(cfg, n) for n in names})


def _plain(model: nn.Module, cfg, preconditioner: str) -> torch.optim.Optimizer:
    """Every tensor on the EMA momentum and ``preconditioner``, no MARS correction."""
    rule = Rule(
        momentum="ema", preconditioner=preconditioner, options=_options(cfg, preconditioner)
    )
    defaults = dict(lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay,
                    **rule.group_keys())  # fmt: skip
    groups = split_aux(model, decay_groups(model, cfg.weight_decay, cfg.decay_kinds), cfg.aux_lr)
    return VarianceReduced(groups, defaults, foreach=cfg.foreach)


def _refuse_sharded(model: nn.Module, name: str, why: str) -> None:
    if any(is_sharded(p) for p in model.parameters()):
        raise ValueError(f"{name} does not run under FSDP (parallel=fsdp): {why}; use DDP")


@dataclass
class SoapFields:
    """SOAP's options (nikhilvyas/SOAP ``soap.py`` defaults, the paper's recommended values)."""

    shampoo_beta: float = -1.0  # -1: betas[1]
    precondition_frequency: int = 10
    max_precond_dim: int = 10000
    merge_dims: bool = False
    precondition_1d: bool = False
    normalize_grads: bool = False
    correct_bias: bool = True


@dataclass
class SoapConfig(SoapFields):
    """SOAP (Vyas et al. 2024). lr 3e-3, betas (0.95, 0.95), wd 0.01: ``soap.py``'s defaults."""

    name: str = "soap"
    lr: float = 3e-3
    betas: list[float] = field(default_factory=lambda: [0.95, 0.95])
    eps: float = 1e-8
    weight_decay: float = 0.01
    decay_kinds: list[str] = field(default_factory=lambda: ["matrix"])
    foreach: bool | None = None  # the core's momentum: foreach (None/true) or the loop
    aux_lr: float | None = None  # set: every non-matrix parameter's peak lr; None: lr

    def __post_init__(self) -> None:
        check_fields(self, PREFIX)


@register("soap", SoapConfig, "SOAP: Adam in the eigenbasis of Shampoo's preconditioner")
def _build_soap(model: nn.Module, cfg: SoapConfig) -> torch.optim.Optimizer:
    _refuse_sharded(model, "soap", "its eigenbases need whole matrices")
    return _plain(model, cfg, "soap")


@dataclass
class MarsSoapConfig(MarsConfig, SoapFields):
    """MARS with the SOAP preconditioner. No published values: SOAP's own (lr 3e-3, betas
    (0.95, 0.95), wd 0.01) with MARS's gamma and non-2-D routing."""

    name: str = "mars-soap"
    lr: float = 3e-3
    betas: list[float] = field(default_factory=lambda: [0.95, 0.95])

    preconditioner: ClassVar[str] = "soap"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.precondition_1d and not self.optimize_1d:
            raise ValueError("optimizer.precondition_1d=true needs optimizer.optimize_1d=true: "
                             "with MARS's routing the 1-D tensors are on AdamW")  # fmt: skip


@register("mars-soap", MarsSoapConfig, "MARS with the SOAP preconditioner")
def _build_mars_soap(model: nn.Module, cfg: MarsSoapConfig) -> torch.optim.Optimizer:
    _refuse_sharded(model, "mars-soap", "its eigenbases need whole matrices")
    return build_mars(model, cfg)


@dataclass
class AdEMAMixFields:
    """AdEMAMix's options (apple/ml-ademamix README: alpha 8, beta3 0.9999; both warmups the
    run's length, which configs/optimizer/ademamix.yaml sets to ``${max_steps}``)."""

    beta3: float = 0.9999  # the reference's betas[2]
    alpha: float = 8.0
    alpha_warmup: int | None = None  # None: no warmup (the constructor's default)
    beta3_warmup: int | None = None


@dataclass
class AdEMAMixConfig(AdEMAMixFields):
    """AdEMAMix (Pagliardini et al. 2024): the README's lr 1e-3, betas (0.9, 0.999), wd 0.1."""

    name: str = "ademamix"
    lr: float = 1e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    weight_decay: float = 0.1
    decay_kinds: list[str] = field(default_factory=lambda: ["matrix"])
    foreach: bool | None = None
    aux_lr: float | None = None  # set: every non-matrix parameter's peak lr; None: lr

    def __post_init__(self) -> None:
        check_fields(self, PREFIX)


@register("ademamix", AdEMAMixConfig, "AdEMAMix: Adam plus a slow EMA of the gradient")
def _build_ademamix(model: nn.Module, cfg: AdEMAMixConfig) -> torch.optim.Optimizer:
    return _plain(model, cfg, "ademamix")


@dataclass
class MarsAdEMAMixConfig(MarsConfig, AdEMAMixFields):
    """MARS with the AdEMAMix preconditioner. No published values: AdEMAMix's README values
    (lr 1e-3, betas (0.9, 0.999), wd 0.1) with MARS's gamma and non-2-D routing."""

    name: str = "mars-ademamix"
    lr: float = 1e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    weight_decay: float = 0.1

    preconditioner: ClassVar[str] = "ademamix"


register("mars-ademamix", MarsAdEMAMixConfig, "MARS with the AdEMAMix preconditioner")(build_mars)


@dataclass
class NorMuonConfig:
    """NorMuon (Li et al. 2025): ``normuon.py``'s defaults (lr 0.02, momentum 0.95, beta2 0.95,
    wd 0; auxiliary Adam lr 3e-4, betas (0.9, 0.95), eps 1e-10, wd 0)."""

    name: str = "normuon"
    lr: float = 0.02
    momentum: float = 0.95
    beta2: float = 0.95
    nesterov: bool = True
    weight_decay: float = 0.0
    ns_steps: int = 5
    ns_dtype: str = "bfloat16"
    ns_distributed: bool = True  # under DDP each rank orthogonalises a share, then all-gather
    adamw_lr: float = 3e-4
    adamw_betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    adamw_eps: float = 1e-10
    adamw_weight_decay: float = 0.0
    aux_lr: float | None = None  # set: the Adam part's lr, in place of adamw_lr; None: adamw_lr

    def __post_init__(self) -> None:
        check_fields(self, PREFIX)


@register("normuon", NorMuonConfig, "NorMuon: Muon with a per-row second moment")
def _build_normuon(model: nn.Module, cfg: NorMuonConfig) -> torch.optim.Optimizer:
    _refuse_sharded(model, "normuon", "its row statistics need whole matrices")
    matrices, rest = _split(model, ("matrix",))
    ns = _options(cfg, "normuon")
    main = Rule(momentum="ema-nesterov", preconditioner="normuon", options=ns).group_keys()
    adam = AdamOptions(eps=cfg.adamw_eps, second_moment="g")
    aux = Rule(momentum="ema-lerp", preconditioner="adam", options=adam).group_keys()
    groups = [
        dict(params=matrices, lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=cfg.momentum,
             nesterov=cfg.nesterov, **main),
        dict(params=rest, lr=cfg.adamw_lr, weight_decay=cfg.adamw_weight_decay,
             betas=tuple(cfg.adamw_betas), **aux),
    ]  # fmt: skip
    return VarianceReduced([g for g in split_aux(model, groups, cfg.aux_lr) if g["params"]])


@dataclass
class AdamWScheduleFreeConfig:
    """Schedule-Free AdamW (Defazio et al. 2024). lr 2.5e-3, eps, r 0 and the warmup (0) are
    the reference's defaults; betas (0.9, 0.95) and wd 0.1 on block matrices are the AdamW
    baseline's GPT-2 values (the reference's defaults, (0.9, 0.999) and 0, are not GPT-2's).
    Use it with ``schedule=constant``: it needs no decaying schedule."""

    name: str = "adamw-schedulefree"
    lr: float = 2.5e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    weight_decay: float = 0.1
    decay_kinds: list[str] = field(default_factory=lambda: ["matrix"])
    warmup_steps: int = 0  # the optimizer's own warmup (the trainer's schedule may warm up too)
    r: float = 0.0
    foreach: bool = True
    aux_lr: float | None = None  # set: every non-matrix parameter's peak lr; None: lr

    def __post_init__(self) -> None:
        check_fields(self, PREFIX)


@register("adamw-schedulefree", AdamWScheduleFreeConfig, "Schedule-Free AdamW")
def _build_schedulefree(model: nn.Module, cfg: AdamWScheduleFreeConfig) -> torch.optim.Optimizer:
    groups = split_aux(model, decay_groups(model, cfg.weight_decay, cfg.decay_kinds), cfg.aux_lr)
    return AdamWScheduleFree(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                             warmup_steps=cfg.warmup_steps, r=cfg.r,
                             foreach=cfg.foreach)  # fmt: skip
