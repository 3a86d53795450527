"""Lion (Chen et al., 2023, "Symbolic Discovery of Optimization Algorithms"), Algorithm 2:

u = sign(beta1 * m + (1 - beta1) * g)
p = p * (1 - lr * wd) - lr * u
m = beta2 * m + (1 - beta2) * g
"""

from __future__ import annotations

import torch

from optim.functional import check_betas


class Lion(torch.optim.Optimizer):
    """Lion with decoupled weight decay; state: one momentum buffer per parameter."""

    def __init__(self, params, lr: float = 1e-4, betas=(0.9, 0.99), weight_decay: float = 0.0):
        if lr < 0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        if weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        check_betas(betas, "betas")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, wd = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(p)
                m, g = state["exp_avg"], p.grad
                u = torch.lerp(g, m, beta1).sign_()  # beta1 * m + (1 - beta1) * g
                p.mul_(1 - lr * wd).add_(u, alpha=-lr)
                m.lerp_(g, 1 - beta2)
        return loss
