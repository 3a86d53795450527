"""AdamW baseline: torch's AdamW with the official grouping (decay on block matrices only)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from optim.groups import decay_groups
from optim.registry import register


@dataclass
class AdamWConfig:
    """torch.optim.AdamW; defaults are the MARS papers' GPT-2 small run (lr 6e-4, wd 0.1)."""

    name: str = "adamw"
    lr: float = 6e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    weight_decay: float = 0.1
    # Parameter kinds that get weight decay (optim/groups.py); the official AdamW decays matrices.
    decay_kinds: list[str] = field(default_factory=lambda: ["matrix"])
    fused: bool | None = None  # None: fused on CUDA, foreach otherwise

    def __post_init__(self) -> None:
        if self.lr < 0:
            raise ValueError(f"optimizer.lr must be >= 0, got {self.lr}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"optimizer.betas must be two numbers in [0, 1), got {self.betas}")
        if self.eps <= 0:
            raise ValueError(f"optimizer.eps must be > 0, got {self.eps}")
        if self.weight_decay < 0:
            raise ValueError(f"optimizer.weight_decay must be >= 0, got {self.weight_decay}")


@register("adamw", AdamWConfig, "torch AdamW, decoupled weight decay on block matrices")
def build_adamw(model: nn.Module, cfg: AdamWConfig) -> torch.optim.Optimizer:
    groups = decay_groups(model, cfg.weight_decay, cfg.decay_kinds)
    on_cuda = next(model.parameters()).is_cuda
    fused = on_cuda if cfg.fused is None else cfg.fused
    return torch.optim.AdamW(
        groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, fused=fused or None
    )
