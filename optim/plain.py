"""A registered preconditioner on the EMA momentum, every tensor, without the MARS correction: the
plain form of the optimizers whose MARS form shares their preconditioner (``soap`` and
``mars-soap``, ``ademamix`` and ``mars-ademamix``).

    m = beta1 * m + (1 - beta1) * g;  p = p * (1 - lr * wd) - lr * preconditioner(m)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from optim.core import VarianceReduced
from optim.groups import decay_groups, split_aux
from optim.preconditioners import options_from
from optim.rule import Rule


def build_plain(model: nn.Module, cfg: Any, preconditioner: str) -> torch.optim.Optimizer:
    """Every tensor of ``model`` on the EMA momentum and ``preconditioner`` (its options: the
    config's fields of the same names), decay on ``cfg.decay_kinds``, ``cfg.aux_lr`` for every
    tensor that is not a block matrix."""
    rule = Rule(momentum="ema", preconditioner=preconditioner,
                options=options_from(preconditioner, cfg))  # fmt: skip
    defaults = dict(lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay,
                    **rule.group_keys())  # fmt: skip
    groups = split_aux(model, decay_groups(model, cfg.weight_decay, cfg.decay_kinds), cfg.aux_lr)
    return VarianceReduced(groups, defaults, foreach=cfg.foreach)
