"""Lion (Chen et al., 2023, "Symbolic Discovery of Optimization Algorithms"), Algorithm 2:

u = sign(beta1 * m + (1 - beta1) * g)
p = p * (1 - lr * wd) - lr * u
m = beta2 * m + (1 - beta2) * g

A thin constructor over the core (optim/core.py): momentum ``lion``, preconditioner ``sign``.
"""

from __future__ import annotations

from optim.core import VarianceReduced
from optim.functional import check_betas


class Lion(VarianceReduced):
    """Lion with decoupled weight decay; state: one momentum buffer (``exp_avg``) per parameter."""

    def __init__(self, params, lr: float = 1e-4, betas=(0.9, 0.99), weight_decay: float = 0.0,
                 *, foreach: bool | None = None, fused: bool | None = None):  # fmt: skip
        if lr < 0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        if weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        check_betas(betas, "betas")
        defaults = dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay,
                        momentum_form="lion", preconditioner="sign")  # fmt: skip
        super().__init__(params, defaults, foreach=foreach, fused=fused)
