"""NorMuon (Li et al. 2025, arXiv 2510.05491): Muon with a per-row second moment.

Reference: zichongli5/NorMuon ``normuon.py`` (``normuon_update``, ``SingleDeviceNorMuon``). Per
hidden matrix (rows x cols), with mu the momentum:

    m = lerp(m, g, 1 - mu);  u = lerp(g, m, mu) (Nesterov) or m       (momentum form ema-nesterov)
    O = NS5(u)                                 (the Muon Newton-Schulz, optim/newton_schulz.py)
    s = lerp(s, mean(O*O, over cols), 1 - beta2)                        (s: rows x 1)
    O' = O / (sqrt(s) + 1e-10);  O' = O' * ||O||_F / (||O'||_F + 1e-10)  (norm kept)
    p = p * (1 - lr * wd) - lr * sqrt(max(1, rows/cols)) * O'

The other tensors (embeddings, head, gains) take the reference's auxiliary Adam:
``m = lerp(m, g, 1 - b1); v = lerp(v, g*g, 1 - b2); p = p * (1 - lr * wd) - lr * m_hat /
(sqrt(v_hat) + eps)`` with their own lr, betas, eps and wd.
Differences from the reference: the normalisation runs in the parameter's dtype (the reference
works on NS5's bfloat16 output); the gradient is not overwritten by the Nesterov lerp (the
reference writes ``u`` into ``p.grad``); a parameter without a gradient is skipped (the
reference steps it with a zero gradient so that its all-gather stays in step). Under FSDP2
NorMuon refuses to run (use DDP).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from optim.momentum import MOMENTA, Momentum
from optim.options import validator
from optim.preconditioners import (
    NewtonSchulz,
    NewtonSchulzOptions,
    Step,
    register_preconditioner,
)
from optim.sharded import is_sharded

NORM_EPS = 1e-10  # the reference's, in both divisions


class EmaNesterov(Momentum):
    """Keller Jordan's current Muon momentum: ``m = lerp(m, g, 1 - mu)``; ``u = lerp(g, m, mu)``
    with the group's ``nesterov``, else ``m``."""

    key, beta_key = "momentum_buffer", "momentum"

    def update(self, group, states, cs, foreach):
        bufs, mu = [s[self.key] for s in states], group["momentum"]
        if foreach:
            torch._foreach_lerp_(bufs, cs, 1 - mu)
            return torch._foreach_lerp(cs, bufs, mu) if group["nesterov"] else bufs
        for b, g in zip(bufs, cs):
            b.lerp_(g, 1 - mu)
        return [torch.lerp(g, b, mu) for g, b in zip(cs, bufs)] if group["nesterov"] else bufs


if "ema-nesterov" not in MOMENTA:
    MOMENTA["ema-nesterov"] = EmaNesterov()


@validator("beta2")
def _beta2(value, key):
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{key} must be in [0, 1), got {value}")


@dataclass(frozen=True)
class NorMuonOptions(NewtonSchulzOptions):
    beta2: float = 0.95  # the per-row second moment's EMA rate


@register_preconditioner("normuon")
class NorMuon(NewtonSchulz):
    """Newton-Schulz, then each row divided by its second moment's root, norm kept (module)."""

    Options = NorMuonOptions

    def init_state(self, p: torch.Tensor, state: dict) -> None:
        if is_sharded(p):
            raise ValueError("normuon does not run under FSDP (parallel=fsdp): its row "
                             "statistics need whole matrices; use DDP")  # fmt: skip
        state["second_momentum_buffer"] = p.new_zeros(p.shape[0], 1)

    def direction(self, states, us, cs, gs, *, beta1, foreach):
        step = super().direction(states, us, cs, gs, beta1=beta1, foreach=foreach)
        beta2 = self.options.beta2
        nums = []
        for state, o in zip(states, step.nums):
            second = state["second_momentum_buffer"]
            norm = o.norm()
            second.lerp_(torch.mean(o * o, dim=-1, keepdim=True), 1 - beta2)
            o = o * (1 / second.sqrt().add_(NORM_EPS))
            nums.append(o.mul_(norm / (o.norm() + NORM_EPS)))
        return Step(nums, None, step.step_sizes, step.keeps)
