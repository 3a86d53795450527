"""The registry's Schedule-Free AdamW (``adamw-schedulefree``): its typed config and builder, for
the class in optim/schedulefree.py.

Every tensor on Schedule-Free AdamW (as the reference and the paper do), decay on ``decay_kinds``
(block matrices, as the AdamW baseline).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from optim.groups import decay_groups, split_aux
from optim.options import OptimizerConfig
from optim.registry import register
from optim.schedulefree import AdamWScheduleFree


@dataclass
class AdamWScheduleFreeConfig(OptimizerConfig):
    """Schedule-Free AdamW (Defazio et al. 2024). lr 2.5e-3, eps, r 0 and the warmup (0) are
    the reference's defaults; betas (0.9, 0.95) and wd 0.1 on block matrices are the AdamW
    baseline's GPT-2 values (the reference's defaults, (0.9, 0.999) and 0, are not GPT-2's).
    Use it with ``schedule=constant``: it needs no decaying schedule."""

    name: str = "adamw-schedulefree"
    lr: float = 2.5e-3
    weight_decay: float = 0.1
    aux_lr: float | None = None  # set: every non-matrix parameter's peak lr; None: lr
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    decay_kinds: list[str] = field(default_factory=lambda: ["matrix"])
    warmup_steps: int = 0  # the optimizer's own warmup (the trainer's schedule may warm up too)
    r: float = 0.0
    foreach: bool = True


@register("adamw-schedulefree", AdamWScheduleFreeConfig, "Schedule-Free AdamW")
def build_schedulefree(model: nn.Module, cfg: AdamWScheduleFreeConfig) -> torch.optim.Optimizer:
    groups = split_aux(model, decay_groups(model, cfg.weight_decay, cfg.decay_kinds), cfg.aux_lr)
    return AdamWScheduleFree(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                             warmup_steps=cfg.warmup_steps, r=cfg.r,
                             foreach=cfg.foreach)  # fmt: skip
