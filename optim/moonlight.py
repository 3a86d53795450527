"""The MARS-M paper's optimizers on the Muon family (optim/muon.py): Moonlight's Muon, MARS-M and
MARS-M in one buffer, as drop-in classes with the official constructors' keywords, and their
registry configs (``moonlight``, ``mars-m``, ``mars-m-efficient``).

Block matrices go on the Newton-Schulz rule with Moonlight's scale 0.2*sqrt(max(A, B)); the
embeddings, head and gains on the AdamW backup with the same lr and weight decay. The update
rules are written out in optim/muon.py's docstring (``moonlight``, ``mars-m``,
``mars-m-efficient``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from optim.groups import split_aux, split_by_kind
from optim.muon import MuonFamily, adamw_group, muon_group, split_matrices
from optim.options import PREFIX, OptimizerConfig, config_kwargs
from optim.registry import register


class Moonlight(MuonFamily):
    """Moonlight's Muon (the MARS-M paper's baseline): Nesterov momentum, scale
    0.2*sqrt(max(A, B)), decay on everything, AdamW backup with the same lr and wd.
    Takes the official constructor's keywords."""

    def __init__(
        self,
        lr: float = 1e-3,
        wd: float = 0.1,
        muon_params=None,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        adamw_params=None,
        adamw_betas=(0.9, 0.95),
        adamw_eps: float = 1e-8,
        *,
        ns_dtype: str = "bfloat16",
        ns_distributed: bool = True,
        implementation: str = "auto",
    ):
        muon_params, adamw_params = split_matrices(muon_params, adamw_params)
        muon = muon_group(
            muon_params,
            lr=lr,
            weight_decay=wd,
            momentum=momentum,
            nesterov=nesterov,
            ns_steps=ns_steps,
            scale="rms",
            ns_dtype=ns_dtype,
            ns_distributed=ns_distributed,
        )
        adamw = adamw_group(adamw_params, lr=lr, weight_decay=wd, betas=adamw_betas, eps=adamw_eps)
        super().__init__([muon, adamw], implementation=implementation)


class MARS_M(MuonFamily):  # noqa: N801  (the official class name)
    """MARS-M: the MARS correction, clipped, in an EMA momentum in front of Moonlight's Muon.

    Takes the official constructor's keywords. Official bug not reproduced: ``clip_c`` was
    accepted and ignored (it always clipped). Here ``clip_c=True`` (the default, matching what the
    official runs did) clips each tensor's c to norm <= 1 and ``clip_c=False`` does not clip;
    ``clip`` ("tensor", "global", "none") overrides it when given.
    """

    def __init__(
        self,
        lr: float = 1e-3,
        wd: float = 0.1,
        muon_params=None,
        momentum: float = 0.95,
        ns_steps: int = 5,
        adamw_params=None,
        adamw_betas=(0.9, 0.95),
        adamw_eps: float = 1e-8,
        gamma: float = 0.025,
        clip_c: bool = True,
        is_approx: bool = True,
        *,
        clip: str | None = None,
        first_step: str = "zero",
        ns_dtype: str = "bfloat16",
        ns_distributed: bool = True,
        implementation: str = "auto",
    ):
        muon_params, adamw_params = split_matrices(muon_params, adamw_params)
        clip = clip if clip is not None else ("tensor" if clip_c else "none")
        muon = muon_group(
            muon_params,
            lr=lr,
            weight_decay=wd,
            momentum=momentum,
            algorithm="mars-m",
            nesterov=False,
            ns_steps=ns_steps,
            scale="rms",
            gamma=gamma,
            clip=clip,
            first_step=first_step,
            ns_dtype=ns_dtype,
            ns_distributed=ns_distributed,
        )
        adamw = adamw_group(adamw_params, lr=lr, weight_decay=wd, betas=adamw_betas, eps=adamw_eps)
        super().__init__([muon, adamw], is_approx=is_approx, implementation=implementation)


class MARS_M_Efficient(MuonFamily):  # noqa: N801  (the official class name)
    """MARS-M with one buffer per matrix: equal to approx MARS-M without clipping (no exact mode)."""

    def __init__(
        self,
        lr: float = 1e-3,
        wd: float = 0.1,
        muon_params=None,
        momentum: float = 0.95,
        ns_steps: int = 5,
        adamw_params=None,
        adamw_betas=(0.9, 0.95),
        adamw_eps: float = 1e-8,
        gamma: float = 0.025,
        *,
        ns_dtype: str = "bfloat16",
        ns_distributed: bool = True,
        implementation: str = "auto",
    ):
        muon_params, adamw_params = split_matrices(muon_params, adamw_params)
        muon = muon_group(
            muon_params,
            lr=lr,
            weight_decay=wd,
            momentum=momentum,
            algorithm="mars-m-efficient",
            nesterov=False,
            ns_steps=ns_steps,
            scale="rms",
            gamma=gamma,
            clip="none",
            ns_dtype=ns_dtype,
            ns_distributed=ns_distributed,
        )
        adamw = adamw_group(adamw_params, lr=lr, weight_decay=wd, betas=adamw_betas, eps=adamw_eps)
        super().__init__([muon, adamw], implementation=implementation)


# --- the registry's configs ----------------------------------------------------------------------


@dataclass
class MuonLikeConfig(OptimizerConfig):
    """What Moonlight, MARS-M and MARS-M-Efficient share: block matrices on the Newton-Schulz
    rule (scale 0.2*sqrt(max(A, B))); embeddings, head and gains on AdamW with the same lr, wd."""

    name: str = "moonlight"
    lr: float = 6e-3
    weight_decay: float = 0.1
    aux_lr: float | None = None  # set: the AdamW part's lr (embeddings, head, gains); None: lr
    momentum: float = 0.95
    ns_steps: int = 5
    ns_dtype: str = "bfloat16"
    ns_distributed: bool = True  # under DDP each rank orthogonalises a share, then all-gather
    adamw_betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    adamw_eps: float = 1e-8


@dataclass
class MoonlightConfig(MuonLikeConfig):
    """Moonlight's Muon (GPT-2 small: lr 6e-3, wd 0.1, Nesterov momentum 0.95)."""

    nesterov: bool = True


@dataclass
class MarsMEfficientConfig(MuonLikeConfig):
    """MARS-M in one buffer per matrix: approx MARS-M without clipping (no exact mode)."""

    name: str = "mars-m-efficient"
    weight_decay: float = 0.01
    gamma: float = 0.025


@dataclass
class MarsMConfig(MarsMEfficientConfig):
    """MARS-M (GPT-2 small: lr 6e-3, wd 0.01 as the official configs, momentum 0.95, gamma
    0.025). ``nesterov`` is recorded to say what the official code does (an EMA momentum, no
    Nesterov) and must stay false."""

    name: str = "mars-m"
    weight_decay: float = 0.01  # the official configs; the MARS-M README says 0.1
    mode: str = "approx"
    nesterov: bool = False
    clip: str = "tensor"  # tensor (official) | global | none
    first_step: str = "zero"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.nesterov:
            raise ValueError(f"{PREFIX}nesterov=true: MARS-M's momentum is an EMA; use false")


def _moonlight_like(model: nn.Module, cfg: MuonLikeConfig, algorithm: str, **options):
    """Block matrices on the Muon-style rule, the rest on AdamW with the same lr and wd."""
    muon, rest = split_by_kind(model, ("matrix",))
    common = dict(lr=cfg.lr, weight_decay=cfg.weight_decay)
    muon_keys = config_kwargs(cfg, "lr", "weight_decay", "adamw_betas", "adamw_eps", "mode",
                              "implementation", "aux_lr")  # fmt: skip
    groups = [
        muon_group(muon, algorithm=algorithm, scale="rms", **common, **muon_keys, **options),
        adamw_group(rest, betas=cfg.adamw_betas, eps=cfg.adamw_eps, **common),
    ]
    return MuonFamily(
        split_aux(model, groups, cfg.aux_lr),
        is_approx=getattr(cfg, "mode", "approx") == "approx",
        implementation=cfg.implementation,
    )


@register("mars-m", MarsMConfig, "MARS-M: the clipped MARS correction in front of Moonlight's Muon")
def build_mars_m(model: nn.Module, cfg: MarsMConfig) -> torch.optim.Optimizer:
    return _moonlight_like(model, cfg, "mars-m")


@register("mars-m-efficient", MarsMEfficientConfig, "MARS-M in one buffer, without the clip")
def build_mars_m_efficient(model: nn.Module, cfg: MarsMEfficientConfig) -> torch.optim.Optimizer:
    return _moonlight_like(model, cfg, "mars-m-efficient", nesterov=False, clip="none")


@register(
    "moonlight",
    MoonlightConfig,
    "Moonlight's Muon (the MARS-M paper's baseline), scale 0.2 sqrt(max(A, B))",
)
def build_moonlight(model: nn.Module, cfg: MoonlightConfig) -> torch.optim.Optimizer:
    return _moonlight_like(model, cfg, "muon")
