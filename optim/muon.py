"""Muon-style optimizers: the family's core class (``MuonFamily``), its param groups, and Muon and
NorMuon with their registry configs (``MuonConfig``, ``NorMuonConfig``; NorMuon's preconditioner
is optim/normuon.py). Moonlight, MARS-M and its one-buffer form, the MARS-M paper's drop-in
classes and their configs, are in optim/moonlight.py. Every one has an AdamW backup.

Matrices in ``use_muon`` groups are updated with an orthogonalised momentum; the other groups run
AdamW. With mu the momentum, ``NS`` five Newton-Schulz steps (optim/functional.py), ``s`` the scale
and ``t`` the AdamW step count:

    muon / moonlight:  buf = mu * buf + g;  u = g + mu * buf (Nesterov) or buf
    mars-m:            c = clip(g + gamma*mu/(1-mu) * (g - g_ref));  buf = mu * buf + (1 - mu) * c;
                       u = buf                      (MARS-M, arXiv 2510.21800, Algorithm 2)
    mars-m-efficient:  buf = mu * buf + (1-gamma)(1-mu)/mu * g;  u = gamma * g + mu * buf
                       (the same direction as approx mars-m without clipping, one buffer)
    every matrix:      p = p * (1 - lr * wd) - lr * s * NS(u)
                       s = sqrt(max(1, rows/cols)) ("shape": Muon) or 0.2*sqrt(max(rows, cols))
                       ("rms": Moonlight, MARS-M)
    AdamW backup:      m = lerp(m, g, 1-b1); v = lerp(v, g*g, 1-b2);
                       p = p * (1 - lr * wd) - lr * sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + eps)
                       (``decay_bias_corrected``: the decay is multiplied by the same bias factor,
                       as the MARS repo's own AdamW under its Muon baseline)

Each class is a thin constructor over the core (optim/core.py): momentum ``heavy-ball``,
``mars-m`` (with the variance-reduced c) or ``one-buffer``, preconditioner ``newton-schulz``;
the AdamW part is momentum ``ema-lerp`` with Adam's ``before_bias_correction`` form.
Newton-Schulz takes exactly the 2-D tensors: a tensor of another rank given as a Muon parameter
goes to the AdamW part (one rule for the whole family; the official MARS-M and Moonlight accept
only 2-D tensors, the MARS repo's Muon flattened them). Newton-Schulz is batched by shape and,
under DDP, split over the ranks and all-gathered (``ns_distributed=True``, the default, as the MARS
repo's Muon; ``False``: every rank computes every update, as Moonlight and MARS-M), with the same
numbers (optim/newton_schulz.py). ``implementation="foreach"`` takes the torch._foreach path;
the default (``auto``) takes it on CUDA (a step's launches do not grow with depth:
bench/launches.py) and the per-tensor loop on a CPU, whose rounding earlier runs used.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from optim import normuon as _normuon  # noqa: F401  (registers "normuon" and "ema-nesterov")
from optim.core import VarianceReduced
from optim.groups import split_aux, split_by_kind
from optim.options import OptimizerConfig, check_option, choice
from optim.preconditioners import AdamOptions, NewtonSchulzOptions, options_from
from optim.registry import register
from optim.rule import Rule, VarianceReduction

# algorithm -> (momentum form, variance reduction)
ALGORITHMS = {
    "muon": ("heavy-ball", False),
    "mars-m": ("mars-m", True),
    "mars-m-efficient": ("one-buffer", False),
}
choice("algorithm", ALGORITHMS)


class MuonFamily(VarianceReduced):
    """Groups with ``use_muon=True`` take the Muon-style update, the rest AdamW (see module)."""

    default_foreach = None  # foreach on CUDA (a bounded number of launches); the loop on a CPU
    adapter_keys = ("use_muon", "algorithm")

    def __init__(self, groups: list[dict], *, is_approx: bool = True,
                 implementation: str = "auto"):  # fmt: skip
        for g in groups:
            if not g["params"]:  # dropped, yet its values are checked (Muon(adamw_betas=...))
                for key, value in g.items():
                    check_option(key, value)
        groups = [g for g in groups if g["params"]]
        for g in groups:
            _check_group(g)
            g.update(_core_keys(g))
        super().__init__(groups, is_approx=is_approx, implementation=implementation)


def _core_keys(g: dict) -> dict:
    """The core's rule for a Muon-family group (optim/core.py)."""
    if not g["use_muon"]:
        adam = AdamOptions(eps=g["eps"], second_moment="g", eps_placement="before_bias_correction",
                           decay_bias_corrected=g["decay_bias_corrected"])  # fmt: skip
        return Rule(momentum="ema-lerp", preconditioner="adam", options=adam).group_keys()
    form, reduced = ALGORITHMS[g["algorithm"]]
    ns = NewtonSchulzOptions(**{k: g[k] for k in NS_KEYS})
    vr = VarianceReduction(g["gamma"], g["clip"], g["first_step"]) if reduced else None
    return Rule(momentum=form, preconditioner="newton-schulz", options=ns,
                variance_reduction=vr).group_keys()  # fmt: skip


NS_KEYS = ("eps", "ns_steps", "ns_dtype", "scale", "ns_batched", "ns_distributed")


def _check_group(g: dict) -> None:
    """What only the Muon family refuses (each value has its validator: optim/options.py)."""
    if not g["use_muon"]:
        return
    check_option("algorithm", g["algorithm"])
    if g["algorithm"] == "mars-m-efficient" and g["clip"] != "none":
        raise ValueError("mars-m-efficient has no clipping: use clip='none' (or plain mars-m)")
    shapes = [tuple(p.shape) for p in g["params"] if p.ndim != 2]
    if shapes:
        raise ValueError(f"Newton-Schulz takes 2-D tensors only, got shapes {shapes}")


def split_matrices(params, adamw_params) -> tuple[list, list]:
    """The 2-D tensors of ``params``; every other tensor joins ``adamw_params``."""
    params, rest = list(params or []), list(adamw_params or [])
    return [p for p in params if p.ndim == 2], rest + [p for p in params if p.ndim != 2]


def muon_group(params, *, lr, weight_decay, momentum=0.95, **options) -> dict:
    """A ``use_muon`` param group with every key the step reads (defaults: Muon's)."""
    group = dict(
        params=list(params),
        use_muon=True,
        lr=lr,
        weight_decay=weight_decay,
        momentum=momentum,
        algorithm="muon",
        nesterov=True,
        ns_steps=5,
        ns_dtype="bfloat16",
        eps=1e-7,
        scale="shape",
        gamma=0.0,
        clip="none",
        first_step="zero",
        ns_batched=True,  # one batched Newton-Schulz call per shape (False: one at a time)
        ns_distributed=True,  # under DDP each rank orthogonalises a share, then all-gather
    )
    unknown = set(options) - set(group)
    if unknown:
        raise TypeError(f"unknown Muon group options {sorted(unknown)}")
    return {**group, **options}


def adamw_group(params, *, lr, weight_decay, betas=(0.9, 0.95), eps=1e-8, bias_corrected=False):
    """An AdamW backup param group."""
    return dict(
        params=list(params),
        use_muon=False,
        lr=lr,
        weight_decay=weight_decay,
        betas=tuple(betas),
        eps=eps,
        decay_bias_corrected=bias_corrected,
    )


class Muon(MuonFamily):
    """Muon (Nesterov momentum, NS5, scale sqrt(max(1, rows/cols))) plus an AdamW part.

    ``params`` go on Muon; ``adamw_params`` (optional) on AdamW with their own lr, betas, eps and
    weight decay. The defaults are the MARS repo's baseline: Muon wd 0, and its own AdamW, whose
    decay is multiplied by the bias-corrected step size (``adamw_decay_bias_corrected``).
    ``nesterov=False`` uses the momentum buffer (the MARS repo's version used the raw gradient).
    """

    def __init__(
        self,
        params,
        lr: float = 0.02,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        weight_decay: float = 0.0,
        *,
        adamw_params=None,
        adamw_lr: float = 3e-3,
        adamw_betas=(0.9, 0.95),
        adamw_eps: float = 1e-8,
        adamw_weight_decay: float = 0.1,
        adamw_decay_bias_corrected: bool = True,
        ns_dtype: str = "bfloat16",
        ns_distributed: bool = True,
        implementation: str = "auto",
    ):
        params, adamw_params = split_matrices(params, adamw_params)
        muon = muon_group(
            params,
            lr=lr,
            weight_decay=weight_decay,
            momentum=momentum,
            nesterov=nesterov,
            ns_steps=ns_steps,
            ns_dtype=ns_dtype,
            ns_distributed=ns_distributed,
        )
        adamw = adamw_group(
            adamw_params,
            lr=adamw_lr,
            weight_decay=adamw_weight_decay,
            betas=adamw_betas,
            eps=adamw_eps,
            bias_corrected=adamw_decay_bias_corrected,
        )
        super().__init__([muon, adamw], implementation=implementation)


# mars-repo: the MARS repo's CombinedOptimizer puts every tensor with ndim >= 2 on Muon, so an
# untied head (2-D) goes there too; recommended: Keller Jordan's block matrices only.
MUON_ROUTINGS = {
    "mars-repo": ("matrix", "embedding", "head", "other"),
    "recommended": ("matrix",),
}
choice("routing", MUON_ROUTINGS)


@dataclass
class MuonConfig(OptimizerConfig):
    """Muon (GPT-2 small in the MARS repo: lr 2e-2, wd 0; its AdamW part lr 3e-3, wd 0.1)."""

    name: str = "muon"
    lr: float = 2e-2
    weight_decay: float = 0.0
    # Set: the peak lr of every non-matrix parameter, taking precedence over adamw_lr (the AdamW
    # part's lr, then not read); under routing=mars-repo the embeddings/head stay on Newton-Schulz
    # (a group of their own) at this lr. None: adamw_lr, and lr for what is on Newton-Schulz.
    aux_lr: float | None = None
    routing: str = "mars-repo"  # mars-repo: every >=2-D tensor incl. embeddings | recommended
    # shape: sqrt(max(1, rows/cols)) (Muon); rms: 0.2*sqrt(max(rows, cols)), which with a
    # weight_decay is the EPFL benchmark's D-Muon (Muon with decoupled weight decay, Moonlight's
    # update RMS): optimizer.scale=rms optimizer.weight_decay=0.1 optimizer.routing=recommended
    scale: str = "shape"
    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    ns_dtype: str = "bfloat16"
    ns_distributed: bool = True  # under DDP each rank orthogonalises a share, then all-gather
    adamw_lr: float = 3e-3
    adamw_betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    adamw_eps: float = 1e-8
    adamw_weight_decay: float = 0.1
    adamw_decay_bias_corrected: bool = True  # the MARS repo's AdamW scales decay by its bias factor


@register(
    "muon", MuonConfig, "Muon as the MARS repo's baseline: Nesterov momentum, 5 Newton-Schulz steps"
)
def build_muon(model: nn.Module, cfg: MuonConfig) -> torch.optim.Optimizer:
    muon, rest = split_by_kind(model, MUON_ROUTINGS[cfg.routing])
    if cfg.routing == "mars-repo":  # Newton-Schulz takes the 2-D tensors; the rest stay on AdamW
        rest += [p for p in muon if p.ndim != 2]
        muon = [p for p in muon if p.ndim == 2]
    groups = [
        muon_group(muon, lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=cfg.momentum,
                   nesterov=cfg.nesterov, ns_steps=cfg.ns_steps, ns_dtype=cfg.ns_dtype,
                   ns_distributed=cfg.ns_distributed, scale=cfg.scale),
        adamw_group(rest, lr=cfg.adamw_lr, weight_decay=cfg.adamw_weight_decay,
                    betas=cfg.adamw_betas, eps=cfg.adamw_eps,
                    bias_corrected=cfg.adamw_decay_bias_corrected),
    ]  # fmt: skip
    return MuonFamily(split_aux(model, groups, cfg.aux_lr), implementation=cfg.implementation)


@dataclass
class NorMuonConfig(OptimizerConfig):
    """NorMuon (Li et al. 2025; its preconditioner: optim/normuon.py): the reference's defaults (lr 0.02, momentum 0.95, beta2 0.95,
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
    return VarianceReduced([g for g in split_aux(model, groups, cfg.aux_lr) if g["params"]],
                           implementation=cfg.implementation)  # fmt: skip
