"""Lion (Chen et al., 2023, "Symbolic Discovery of Optimization Algorithms"), Algorithm 2:

u = sign(beta1 * m + (1 - beta1) * g)
p = p * (1 - lr * wd) - lr * u
m = beta2 * m + (1 - beta2) * g

A thin constructor over the core (optim/core.py): momentum ``lion``, preconditioner ``sign``;
``LionConfig`` is the registry's ``lion``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from optim.core import VarianceReduced
from optim.groups import decay_groups, split_aux
from optim.options import OptimizerConfig
from optim.registry import register
from optim.rule import Rule

LION_RULE = Rule(momentum="lion", preconditioner="sign")


class Lion(VarianceReduced):
    """Lion with decoupled weight decay; state: one momentum buffer (``exp_avg``) per parameter."""

    def __init__(self, params, lr: float = 1e-4, betas=(0.9, 0.99), weight_decay: float = 0.0,
                 *, implementation: str = "auto"):  # fmt: skip
        defaults = dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay,
                        **LION_RULE.group_keys())  # fmt: skip
        super().__init__(params, defaults, implementation=implementation)


@dataclass
class LionConfig(OptimizerConfig):
    """Lion. Not in the MARS papers' tables; defaults follow the Lion paper's advice relative to
    AdamW's GPT-2 small values (lr / 3, weight decay x 3, betas (0.9, 0.99))."""

    name: str = "lion"
    lr: float = 2e-4
    weight_decay: float = 0.3
    aux_lr: float | None = None  # set: every non-matrix parameter's peak lr; None: lr
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    decay_kinds: list[str] = field(default_factory=lambda: ["matrix"])


@register("lion", LionConfig, "Lion (sign of interpolated momentum)")
def build_lion(model: nn.Module, cfg: LionConfig) -> torch.optim.Optimizer:
    groups = split_aux(model, decay_groups(model, cfg.weight_decay, cfg.decay_kinds), cfg.aux_lr)
    return Lion(groups, lr=cfg.lr, betas=tuple(cfg.betas), implementation=cfg.implementation)
