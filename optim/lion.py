"""Lion (Chen et al., 2023, "Symbolic Discovery of Optimization Algorithms"), Algorithm 2:

u = sign(beta1 * m + (1 - beta1) * g)
p = p * (1 - lr * wd) - lr * u
m = beta2 * m + (1 - beta2) * g

A thin constructor over the core (optim/core.py): momentum ``lion``, preconditioner ``sign``.
"""

from __future__ import annotations

from optim.core import VarianceReduced
from optim.rule import Rule

LION_RULE = Rule(momentum="lion", preconditioner="sign")


class Lion(VarianceReduced):
    """Lion with decoupled weight decay; state: one momentum buffer (``exp_avg``) per parameter."""

    def __init__(self, params, lr: float = 1e-4, betas=(0.9, 0.99), weight_decay: float = 0.0,
                 *, foreach: bool | None = None, fused: bool | None = None):  # fmt: skip
        defaults = dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay,
                        **LION_RULE.group_keys())  # fmt: skip
        super().__init__(params, defaults, foreach=foreach, fused=fused)
