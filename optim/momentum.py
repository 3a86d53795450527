"""Momentum forms: each keeps one buffer per tensor and returns what the preconditioner sees.

- ``ema``:        m = beta1 * m + (1 - beta1) * c      (MARS; state ``exp_avg``)
- ``ema-lerp``:   the same as ``m.lerp_(c, 1 - beta1)``  (Moonlight's and the MARS repo's AdamW)
- ``mars-m``:     buf = mu * buf + (1 - mu) * c         (MARS-M; state ``momentum_buffer``)
- ``heavy-ball``: buf = mu * buf + g; u = g + mu * buf (``nesterov``) or buf (Muon, Moonlight)
- ``one-buffer``: buf = mu * buf + (1 - gamma)(1 - mu)/mu * g; u = gamma * g + mu * buf
                  (MARS-M-Efficient: approx MARS-M without clipping in one buffer)
- ``lion``:       u = beta1 * m + (1 - beta1) * g; then m = beta2 * m + (1 - beta2) * g (Lion)

Each form writes the arithmetic of the official code it comes from (mul-add or lerp), so the
numbers of every official optimizer are kept bit for bit; fast (foreach) and plain paths agree.
"""

from __future__ import annotations

import torch

Tensors = list[torch.Tensor]


class Momentum:
    """One buffer per tensor under ``key``; ``beta`` reads the coefficient from the group.
    (The core keeps ``state["step"]`` for every form.)"""

    key = "exp_avg"
    beta_key = "betas"

    def check(self, group: dict) -> None:
        """Refuse a group this form cannot run (beyond each option's own validator)."""

    def beta(self, group: dict) -> float:
        value = group[self.beta_key]
        return value[0] if self.beta_key == "betas" else value

    def init_state(self, p: torch.Tensor, state: dict) -> None:
        state[self.key] = torch.zeros_like(p, memory_format=torch.preserve_format)

    def update(self, group: dict, states: list[dict], cs: Tensors, foreach: bool) -> Tensors:
        raise NotImplementedError


def _ema(bufs: Tensors, cs: Tensors, beta: float, foreach: bool) -> None:
    """``buf = beta * buf + (1 - beta) * c`` as mul then add (the official MARS arithmetic)."""
    if foreach:
        torch._foreach_mul_(bufs, beta)
        torch._foreach_add_(bufs, cs, alpha=1 - beta)
    else:
        for b, c in zip(bufs, cs):
            b.mul_(beta).add_(c, alpha=1 - beta)


class EMA(Momentum):
    """``m = beta1 * m + (1 - beta1) * c``; ``lerp``: as ``m.lerp_(c, 1 - beta1)``."""

    def __init__(self, key: str, beta_key: str, *, lerp: bool = False):
        self.key, self.beta_key, self.lerp = key, beta_key, lerp

    def update(self, group, states, cs, foreach):
        bufs, beta = [s[self.key] for s in states], self.beta(group)
        if not self.lerp:
            _ema(bufs, cs, beta, foreach)
        elif foreach:
            torch._foreach_lerp_(bufs, cs, 1 - beta)
        else:
            for b, c in zip(bufs, cs):
                b.lerp_(c, 1 - beta)
        return bufs


class HeavyBall(Momentum):
    """``buf = mu * buf + g``; ``u = g + mu * buf`` with the group's ``nesterov``, else ``buf``."""

    key, beta_key = "momentum_buffer", "momentum"

    def update(self, group, states, cs, foreach):
        bufs, mu = [s[self.key] for s in states], group["momentum"]
        if foreach:
            torch._foreach_mul_(bufs, mu)
            torch._foreach_add_(bufs, cs)
            if not group["nesterov"]:
                return bufs
            us = torch._foreach_mul(bufs, mu)
            torch._foreach_add_(us, cs)  # mu * buf + g: the same rounding as g + mu * buf
            return us
        for b, g in zip(bufs, cs):
            b.mul_(mu).add_(g)
        return [g + mu * b for g, b in zip(cs, bufs)] if group["nesterov"] else bufs


class OneBuffer(Momentum):
    """MARS-M-Efficient: ``buf = mu * buf + (1-gamma)(1-mu)/mu * g``; ``u = gamma*g + mu*buf``."""

    key, beta_key = "momentum_buffer", "momentum"

    def check(self, group: dict) -> None:
        if group["momentum"] == 0:
            raise ValueError(
                "momentum must be in (0, 1) for the one-buffer form (it divides by it)"
            )

    def update(self, group, states, cs, foreach):
        bufs, mu, gamma = [s[self.key] for s in states], group["momentum"], group["gamma"]
        phi = (1 - gamma) * (1 - mu) / mu
        if foreach:
            torch._foreach_mul_(bufs, mu)
            torch._foreach_add_(bufs, cs, alpha=phi)
            us = torch._foreach_mul(cs, gamma)
            torch._foreach_add_(us, torch._foreach_mul(bufs, mu))
            return us
        for b, g in zip(bufs, cs):
            b.mul_(mu).add_(g, alpha=phi)
        return [gamma * g + mu * b for g, b in zip(cs, bufs)]


class LionMomentum(Momentum):
    """Lion: ``u = lerp(g, m, beta1)``, then ``m = lerp(m, g, 1 - beta2)``."""

    def update(self, group, states, cs, foreach):
        ms = [s[self.key] for s in states]
        beta1, beta2 = group["betas"]
        if foreach:
            us = torch._foreach_lerp(cs, ms, beta1)
            torch._foreach_lerp_(ms, cs, 1 - beta2)
            return us
        us = [torch.lerp(g, m, beta1) for g, m in zip(cs, ms)]
        for m, g in zip(ms, cs):
            m.lerp_(g, 1 - beta2)
        return us


MOMENTA: dict[str, Momentum] = {
    "ema": EMA("exp_avg", "betas"),
    "ema-lerp": EMA("exp_avg", "betas", lerp=True),
    "mars-m": EMA("momentum_buffer", "momentum"),
    "heavy-ball": HeavyBall(),
    "one-buffer": OneBuffer(),
    "lion": LionMomentum(),
}
