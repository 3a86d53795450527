"""AdEMAMix (Pagliardini et al. 2024, arXiv 2409.03137): Adam plus a slow EMA of the gradient.

Reference: apple/ml-ademamix ``pytorch/ademamix.py``. Per tensor, at step t:

    m1 = beta1 * m1 + (1 - beta1) * c                (the core's EMA: state ``exp_avg``)
    m2 = beta3_t * m2 + (1 - beta3_t) * c            (state ``exp_avg_slow``, no bias correction)
    v  = beta2 * v + (1 - beta2) * c*c
    p  = p * (1 - lr * wd) - lr * (m1 / (1 - beta1^t) + alpha_t * m2)
                                 / (sqrt(v) / sqrt(1 - beta2^t) + eps)

with the warmups of the reference: ``alpha_t = alpha * min(1, t / alpha_warmup)`` (linear from
0) and ``beta3_t`` linear in the half-life from beta1 to beta3 over ``beta3_warmup`` steps
(``f(b) = ln(0.5) / ln(b + 1e-8) - 1``, ``beta3_t = 0.5^(1 / (f_t + 1))``); None: no warmup.
The paper and its README set both warmups to the run's length.

``c`` is the gradient for ``ademamix`` and the variance-reduced, clipped gradient for
``mars-ademamix`` (optim/core.py). Differences from the reference: ``beta3`` is its own option
(the reference's third ``betas`` entry), the decay is the core's ``p * (1 - lr * wd)`` (the
reference adds ``wd * p`` to the update: the same value up to rounding), and with beta1 = 0 the
m1 buffer is still kept (the reference drops it; the update is the same).
Element-wise only: under FSDP2 it runs on each rank's shards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from optim.options import validator
from optim.preconditioners import Options, Preconditioner, Step, register_preconditioner

Tensors = list[torch.Tensor]


@validator("beta3")
def _beta3(value, key):
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{key} must be in [0, 1), got {value}")


@validator("alpha")
def _alpha(value, key):
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{key} must be a finite number >= 0, got {value}")


@validator("alpha_warmup", "beta3_warmup")
def _warmup(value, key):
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{key} must be None (no warmup) or an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class AdEMAMixOptions(Options):
    eps: float = 1e-8
    beta3: float = 0.9999
    alpha: float = 8.0
    alpha_warmup: int | None = None
    beta3_warmup: int | None = None


def alpha_at(t: int, alpha: float, warmup: int | None) -> float:
    """The reference's ``linear_warmup_scheduler`` from 0 to ``alpha``."""
    if warmup is None or t >= warmup:
        return alpha
    a = t / float(warmup)
    return (1.0 - a) * 0.0 + a * alpha


def beta3_at(t: int, beta3: float, beta1: float, warmup: int | None) -> float:
    """The reference's ``linear_hl_warmup_scheduler``: half-life linear from beta1's to beta3's."""
    if warmup is None or t >= warmup:
        return beta3

    def half_life(beta: float, eps: float = 1e-8) -> float:
        return math.log(0.5) / math.log(beta + eps) - 1

    a = t / float(warmup)
    return math.pow(0.5, 1 / ((1.0 - a) * half_life(beta1) + a * half_life(beta3) + 1))


@register_preconditioner("ademamix")
class AdEMAMix(Preconditioner):
    """AdEMAMix's direction on the core's EMA momentum (module docstring)."""

    Options = AdEMAMixOptions

    def init_state(self, p: torch.Tensor, state: dict) -> None:
        state["exp_avg_slow"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)

    def direction(self, states, us, cs, gs, *, beta1, foreach):
        by_step: dict[int, list[int]] = {}  # tensors at the same step share alpha_t, beta3_t
        for i, s in enumerate(states):
            by_step.setdefault(s["step"], []).append(i)
        nums: list = [None] * len(us)
        dens: list = [None] * len(us)
        for t, idx in by_step.items():
            num, den = self._pieces(t, [states[i] for i in idx], [us[i] for i in idx],
                                    [cs[i] for i in idx], beta1, foreach)  # fmt: skip
            for j, i in enumerate(idx):
                nums[i], dens[i] = num[j], den[j]
        n, lr, wd = len(us), self.group["lr"], self.group["weight_decay"]
        return Step(nums, dens, [lr] * n, [1 - lr * wd] * n)

    def _pieces(self, t, states, ms, cs, beta1, foreach) -> tuple[Tensors, Tensors]:
        o, beta2 = self.options, self.group["betas"][1]
        alpha = alpha_at(t, o.alpha, o.alpha_warmup)
        beta3 = beta3_at(t, o.beta3, beta1, o.beta3_warmup)
        bc1, bc2_sqrt = 1 - beta1**t, math.sqrt(1 - beta2**t)
        slows, vs = [s["exp_avg_slow"] for s in states], [s["exp_avg_sq"] for s in states]
        if foreach:
            torch._foreach_mul_(slows, beta3)
            torch._foreach_add_(slows, cs, alpha=1 - beta3)
            torch._foreach_mul_(vs, beta2)
            torch._foreach_addcmul_(vs, cs, cs, value=1 - beta2)
            den = torch._foreach_sqrt(vs)
            torch._foreach_div_(den, bc2_sqrt)
            torch._foreach_add_(den, o.eps)
            num = torch._foreach_div(ms, bc1)
            torch._foreach_add_(num, slows, alpha=alpha)
            return num, den
        for slow, v, c in zip(slows, vs, cs):
            slow.mul_(beta3).add_(c, alpha=1 - beta3)
            v.mul_(beta2).addcmul_(c, c, value=1 - beta2)
        den = [(v.sqrt() / bc2_sqrt).add_(o.eps) for v in vs]
        num = [m.div(bc1).add_(slow, alpha=alpha) for m, slow in zip(ms, slows)]
        return num, den


# --- AdEMAMix's options as config fields (AdEMAMixConfig in optim/plain.py, MARS's in mars.py) ---


@dataclass
class AdEMAMixFields:
    """AdEMAMix's options (apple/ml-ademamix README: alpha 8, beta3 0.9999; both warmups the
    run's length, which configs/optimizer/ademamix.yaml sets to ``${max_steps}``)."""

    beta3: float = 0.9999  # the reference's betas[2]
    alpha: float = 8.0
    alpha_warmup: int | None = None  # None: no warmup (the constructor's default)
    beta3_warmup: int | None = None
