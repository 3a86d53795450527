"""AdamW baseline: torch's AdamW with the official grouping (decay on block matrices only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn as nn

from optim import implementation as implementations
from optim.groups import decay_groups, split_aux  # noqa: F401  (split_aux: its old home)
from optim.options import OptimizerConfig
from optim.registry import register


@dataclass
class AdamWConfig(OptimizerConfig):
    """torch.optim.AdamW; defaults are the MARS papers' GPT-2 small run (lr 6e-4, wd 0.1)."""

    name: str = "adamw"
    lr: float = 6e-4
    weight_decay: float = 0.1
    # Peak lr of every parameter that is not a block matrix (embedding = tied head, untied
    # head, positions, gains, biases), the same knob in every optimizer (optim/groups.py
    # split_aux). None: ``lr`` for all, the official baseline. The schedule scales both.
    aux_lr: float | None = None
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    # Parameter kinds that get weight decay (optim/groups.py); the official AdamW decays matrices.
    decay_kinds: list[str] = field(default_factory=lambda: ["matrix"])
    # auto: torch's fused kernel on CUDA, foreach otherwise | loop: torch's per-tensor loop |
    # foreach | torch-fused: torch's own fused kernel on any device (docs/optim-engine.md)
    implementation: str = "auto"

    valid_implementations: ClassVar[tuple[str, ...]] = implementations.TORCH_ADAMW


@register("adamw", AdamWConfig, "torch's AdamW, decay on block matrices only")
def build_adamw(model: nn.Module, cfg: AdamWConfig) -> torch.optim.Optimizer:
    groups = split_aux(model, decay_groups(model, cfg.weight_decay, cfg.decay_kinds), cfg.aux_lr)
    how = cfg.implementation
    if how == "auto":
        how = "torch-fused" if next(model.parameters()).is_cuda else "foreach"
    # Not fused: foreach (auto), which torch itself picks on CUDA only. On the CPU its per-tensor
    # loop is mostly Python for small models (proxy-100k: 2.3 ms of CPU per step, 1.7 ms
    # foreach), and foreach gives the same values bit for bit (tests/test_optim_basics.py).
    kw = {"torch-fused": {"fused": True}, "foreach": {"foreach": True},
          "loop": {"foreach": False}}[how]  # fmt: skip
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, **kw)
