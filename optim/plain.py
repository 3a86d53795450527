"""A registered preconditioner on the EMA momentum, every tensor, without the MARS correction: the
registry's ``soap`` and ``ademamix`` (their MARS forms, ``mars-soap`` and ``mars-ademamix``, are in
optim/mars.py), their configs and their one builder.

    m = beta1 * m + (1 - beta1) * g;  p = p * (1 - lr * wd) - lr * preconditioner(m)

SOAP leaves dimensions above ``max_precond_dim`` (GPT-2's vocabulary) unrotated and runs plain
Adam on 1-D tensors, as the reference does; decay on ``decay_kinds`` (block matrices).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from optim.ademamix import AdEMAMixFields
from optim.core import VarianceReduced
from optim.groups import decay_groups, split_aux
from optim.options import OptimizerConfig
from optim.preconditioners import options_from
from optim.registry import register
from optim.rule import Rule
from optim.soap import SoapFields


def build_plain(model: nn.Module, cfg: Any, preconditioner: str) -> torch.optim.Optimizer:
    """Every tensor of ``model`` on the EMA momentum and ``preconditioner`` (its options: the
    config's fields of the same names), decay on ``cfg.decay_kinds``, ``cfg.aux_lr`` for every
    tensor that is not a block matrix."""
    rule = Rule(momentum="ema", preconditioner=preconditioner,
                options=options_from(preconditioner, cfg))  # fmt: skip
    defaults = dict(lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay,
                    **rule.group_keys())  # fmt: skip
    groups = split_aux(model, decay_groups(model, cfg.weight_decay, cfg.decay_kinds), cfg.aux_lr)
    return VarianceReduced(groups, defaults, implementation=cfg.implementation)


@dataclass
class SoapConfig(OptimizerConfig, SoapFields):
    """SOAP (Vyas et al. 2024; optim/soap.py). lr 3e-3, betas (0.95, 0.95), wd 0.01: the
    reference ``soap.py``'s defaults."""

    name: str = "soap"
    lr: float = 3e-3
    weight_decay: float = 0.01
    aux_lr: float | None = None  # set: every non-matrix parameter's peak lr; None: lr
    betas: list[float] = field(default_factory=lambda: [0.95, 0.95])
    eps: float = 1e-8
    decay_kinds: list[str] = field(default_factory=lambda: ["matrix"])


@register("soap", SoapConfig, "SOAP: Adam in the eigenbasis of Shampoo's preconditioner")
def build_soap(model: nn.Module, cfg: SoapConfig) -> torch.optim.Optimizer:
    return build_plain(model, cfg, "soap")


@dataclass
class AdEMAMixConfig(OptimizerConfig, AdEMAMixFields):
    """AdEMAMix (Pagliardini et al. 2024; optim/ademamix.py): the README's lr 1e-3, betas
    (0.9, 0.999), wd 0.1."""

    name: str = "ademamix"
    lr: float = 1e-3
    weight_decay: float = 0.1
    aux_lr: float | None = None  # set: every non-matrix parameter's peak lr; None: lr
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    decay_kinds: list[str] = field(default_factory=lambda: ["matrix"])


@register("ademamix", AdEMAMixConfig, "AdEMAMix: Adam plus a slow EMA of the gradient")
def build_ademamix(model: nn.Module, cfg: AdEMAMixConfig) -> torch.optim.Optimizer:
    return build_plain(model, cfg, "ademamix")
