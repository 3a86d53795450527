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

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from optim.core import VarianceReduced
from optim.groups import split_aux, split_by_kind
from optim.momentum import MOMENTA, Momentum
from optim.options import OptimizerConfig, validator
from optim.preconditioners import (
    AdamOptions,
    NewtonSchulz,
    NewtonSchulzOptions,
    Step,
    options_from,
    register_preconditioner,
)
from optim.registry import register
from optim.rule import Rule
from optim.sharded import is_sharded, refuse_sharded

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


# --- the registry's config -----------------------------------------------------------------------


@dataclass
class NorMuonConfig(OptimizerConfig):
    """NorMuon (Li et al. 2025): ``normuon.py``'s defaults (lr 0.02, momentum 0.95, beta2 0.95,
    wd 0; auxiliary Adam lr 3e-4, betas (0.9, 0.95), eps 1e-10, wd 0). The block matrices on
    NorMuon; embeddings, head and gains on Adam, as the reference's README (Muon's) asks."""

    name: str = "normuon"
    lr: float = 0.02
    weight_decay: float = 0.0
    aux_lr: float | None = None  # set: the Adam part's lr, in place of adamw_lr; None: adamw_lr
    momentum: float = 0.95
    beta2: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    ns_dtype: str = "bfloat16"
    ns_distributed: bool = True  # under DDP each rank orthogonalises a share, then all-gather
    adamw_lr: float = 3e-4
    adamw_betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    adamw_eps: float = 1e-10
    adamw_weight_decay: float = 0.0


@register("normuon", NorMuonConfig, "NorMuon: Muon with a per-row second moment")
def build_normuon(model: nn.Module, cfg: NorMuonConfig) -> torch.optim.Optimizer:
    refuse_sharded(model.parameters(), "normuon", "its row statistics need whole matrices")
    matrices, rest = split_by_kind(model, ("matrix",))
    ns = options_from("normuon", cfg)
    main = Rule(momentum="ema-nesterov", preconditioner="normuon", options=ns).group_keys()
    adam = AdamOptions(eps=cfg.adamw_eps, second_moment="g")
    aux = Rule(momentum="ema-lerp", preconditioner="adam", options=adam).group_keys()
    groups = [
        dict(params=matrices, lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=cfg.momentum,
             nesterov=cfg.nesterov, **main),
        dict(params=rest, lr=cfg.adamw_lr, weight_decay=cfg.adamw_weight_decay,
             betas=tuple(cfg.adamw_betas), **aux),
    ]  # fmt: skip
    return VarianceReduced([g for g in split_aux(model, groups, cfg.aux_lr) if g["params"]])
