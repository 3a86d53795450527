"""AdamW baseline: torch's AdamW with the official grouping (decay on block matrices only)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from optim.groups import classify_parameters, decay_groups
from optim.options import check_fields, check_option
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
    # Peak lr of every parameter that is not a block matrix (embedding, head, gains, biases):
    # the parameters the Muon family trains on its AdamW part at its own lr. None: ``lr`` (one
    # lr for all, the official baseline). The schedule scales both (each group's own peak).
    aux_lr: float | None = None

    def __post_init__(self) -> None:
        check_fields(self, "optimizer.")
        if self.aux_lr is not None:
            check_option("lr", self.aux_lr, "optimizer.aux_lr")


def split_aux(model: nn.Module, groups: list[dict], aux_lr: float) -> list[dict]:
    """``groups`` with every non-``matrix`` parameter moved to a group of its own at ``aux_lr``
    (one per weight decay it had), labelled ``kind: aux`` (the study's routing table reads it)."""
    matrix = {id(p) for _, p in classify_parameters(model)["matrix"]}
    out = []
    for g in groups:
        main = [p for p in g["params"] if id(p) in matrix]
        aux = [p for p in g["params"] if id(p) not in matrix]
        out += [{**g, "params": main}] if main else []
        out += [{**g, "params": aux, "lr": aux_lr, "kind": "aux"}] if aux else []
    return out


@register("adamw", AdamWConfig, "torch AdamW, decoupled weight decay on block matrices")
def build_adamw(model: nn.Module, cfg: AdamWConfig) -> torch.optim.Optimizer:
    groups = decay_groups(model, cfg.weight_decay, cfg.decay_kinds)
    if cfg.aux_lr is not None:
        groups = split_aux(model, groups, cfg.aux_lr)
    on_cuda = next(model.parameters()).is_cuda
    fused = on_cuda if cfg.fused is None else cfg.fused
    return torch.optim.AdamW(
        groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, fused=fused or None
    )
