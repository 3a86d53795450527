"""MARS (Yuan et al., ICML 2025): the official ``MARS`` class as a thin constructor over the core.

Per tensor on the MARS branch (2-D tensors; every tensor with ``optimize_1d=True``), with
``kappa = gamma * beta1 / (1 - beta1)`` and ``t`` the tensor's step count:

    c = g + kappa * (g - g_ref)              # g_ref: last step's gradient (approx mode) or the
    c = c / max(1, ||c||)                    #   gradient of this batch at the last weights (exact)
    m = beta1 * m + (1 - beta1) * c
    mars-adamw:   v = beta2 * v + (1 - beta2) * c*c
                  p -= lr * (wd * p + m / ((sqrt(v) / sqrt(1 - beta2^t) + eps) * (1 - beta1^t)))
    mars-lion:    p -= lr * (wd * p + sign(m))
    mars-shampoo: p -= lr * (wd * p + sqrt(max(1, rows/cols)) * NewtonSchulz5(m / (1 - beta1)))

Other tensors (``optimize_1d=False``) take AdamW on the raw gradient with ``betas_1d``,
``weight_decay_1d`` (whatever their group's weight_decay) and lr ``lr * lr_1d / lr_init`` (so the
schedule scales it too). This is the official code (AGI-Arena/MARS ``mars.py``); the class takes
its constructor keywords, so ``from optim import MARS`` is a drop-in: a thin adapter that spells
``mars_rule`` (the typed rule every MARS instance shares, optim/rule.py) as param groups for the
core (optim/core.py): momentum ``ema``, preconditioner ``adam`` / ``sign`` / ``newton-schulz`` by
``mars_type``. The registry's MARS optimizers are typed configs (``MarsConfig`` and its
subclasses, below) built by ``build_mars``, which takes any registered preconditioner
(docs/adding-an-optimizer.md), not only these three. Differences from the official code:

- knobs where ports disagree, defaulting to the official behaviour: ``clip`` (``tensor``,
  ``global``, ``none``), ``second_moment`` (``c``: v from the clipped c as the code; ``g``: from
  the raw gradient as the paper's formula), ``first_step`` (``zero``: g_ref = 0 so the first c is
  ``(1 + kappa) * g``; ``plain``: the first c is g, as timm);
- bugs not reproduced: the approx-mode reference gradient is a copy (the official code keeps an
  alias of ``p.grad``, which silently turns MARS off under ``zero_grad(set_to_none=False)``);
  ``gamma`` set in a param group is honoured (the official code reads the constructor's);
  clipping needs no host synchronisation.

Exact mode (``is_approx=False``): before each step the training loop computes the gradient of the
*next* batch at the current weights and calls ``store_reference_grad()``; ``step()`` uses the
reference stored one step earlier and then promotes the new one. ``update_previous_grad`` and
``update_last_grad`` are the official names (the latter is a no-op: ``step`` promotes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn as nn

from optim.ademamix import AdEMAMixFields
from optim.core import VarianceReduced
from optim.groups import decay_groups, split_aux
from optim.options import PREFIX, OptimizerConfig, check_option, choice, config_kwargs
from optim.preconditioners import AdamOptions, NewtonSchulzOptions, options_from
from optim.registry import register
from optim.rule import Rule, Split1D, VarianceReduction
from optim.soap import SoapFields

MARS_TYPES = {"mars-adamw": "adam", "mars-lion": "sign", "mars-shampoo": "newton-schulz"}
choice("mars_type", MARS_TYPES)


def mars_rule(preconditioner: str, options, *, gamma: float, clip: str, first_step: str,
              optimize_1d: bool, lr: float, lr_1d: float, betas_1d, weight_decay_1d: float,
              ) -> Rule:  # fmt: skip
    """The MARS rule: the correction, an EMA momentum, ``preconditioner``; with
    ``optimize_1d=False`` non-2-D tensors on AdamW at ``lr * lr_1d / lr`` (frozen here, as the
    official code, so that the schedule scales it too)."""
    check_option("lr_1d", lr_1d)
    split = Split1D(lr_1d / lr, tuple(betas_1d), weight_decay_1d)
    return Rule(
        momentum="ema",
        preconditioner=preconditioner,
        options=options,
        variance_reduction=VarianceReduction(gamma, clip, first_step),
        split_1d=None if optimize_1d else split,
    )


class MARS(VarianceReduced):
    """MARS-AdamW / MARS-Lion / MARS-Shampoo, approx or exact; see the module docstring."""

    default_foreach = True  # foreach is faster on CPU too (bench/optim.py)
    adapter_keys = ("mars_type", "optimize_1d")  # the official names; a group may set its own

    def __init__(
        self,
        params,
        lr: float = 3e-3,
        betas=(0.95, 0.99),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        gamma: float = 0.025,
        is_approx: bool = True,
        mars_type: str = "mars-adamw",
        optimize_1d: bool = False,
        lr_1d: float = 3e-3,
        betas_1d=(0.9, 0.95),
        weight_decay_1d: float = 0.1,
        *,
        clip: str = "tensor",
        second_moment: str = "c",
        first_step: str = "zero",
        ns_steps: int = 5,
        ns_dtype: str = "bfloat16",
        ns_distributed: bool = True,
        implementation: str = "auto",
    ):
        check_option("mars_type", mars_type)
        check_option("lr", lr)
        # every mars_type's options, so that a group may pick its own mars_type
        ns = NewtonSchulzOptions(eps=eps, ns_steps=ns_steps, ns_dtype=ns_dtype, ns_debias=True,
                                 ns_distributed=ns_distributed)  # fmt: skip
        adam = AdamOptions(eps=eps, amsgrad=amsgrad, second_moment=second_moment)
        rule = mars_rule(MARS_TYPES[mars_type], None, gamma=gamma, clip=clip,
                         first_step=first_step, optimize_1d=False, lr=lr, lr_1d=lr_1d,
                         betas_1d=betas_1d, weight_decay_1d=weight_decay_1d)  # fmt: skip
        defaults = dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay,
                        mars_type=mars_type, optimize_1d=optimize_1d,
                        **{**rule.group_keys(), **ns.group_keys(), **adam.group_keys()})  # fmt: skip
        super().__init__(params, defaults, is_approx=is_approx, implementation=implementation)

    def add_param_group(self, param_group: dict) -> None:
        """A group's own ``mars_type`` / ``optimize_1d`` pick its rule (as the official code)."""
        group = {**self.defaults, **param_group}
        check_option("mars_type", group["mars_type"])
        group["preconditioner"] = MARS_TYPES[group["mars_type"]]
        group["split_1d"] = not group["optimize_1d"]
        super().add_param_group(group)


# --- the registry's MARS optimizers: their typed configs and their one builder -------------------


@dataclass
class MarsConfig(OptimizerConfig):
    """What MARS-AdamW, -Lion and -Shampoo share (GPT-2 small: lr 6e-3, lr_1d 3e-3, wd 0.01,
    betas (0.95, 0.99), gamma 0.025; docs/reproduction.md, "2.2 Per optimizer and size"). Every
    knob where ports of MARS disagree defaults to the official code (docs/official-code.md)."""

    name: str = "mars-adamw"
    lr: float = 6e-3
    weight_decay: float = 0.01
    # Set: the embeddings/head (on the MARS rule) and the non-2-D tensors (on the fallback, in
    # place of lr_1d, which is then not read) at this peak lr; None: lr and lr_1d as below.
    aux_lr: float | None = None
    mode: str = "approx"  # approx: g_ref = last step's gradient; exact: two gradients per step
    betas: list[float] = field(default_factory=lambda: [0.95, 0.99])
    eps: float = 1e-8
    decay_kinds: list[str] = field(default_factory=lambda: ["matrix"])  # official: Linear only
    gamma: float = 0.025
    # gamma per step (optim/schedules.py): constant | linear | cosine, from gamma to gamma_end
    # over the lr schedule's horizon (schedule.decay_steps, else max_steps)
    gamma_schedule: str = "constant"
    gamma_end: float = 0.0
    optimize_1d: bool = False  # False: non-2-D tensors on the AdamW fallback (official)
    lr_1d: float = 3e-3
    betas_1d: list[float] = field(default_factory=lambda: [0.9, 0.95])
    weight_decay_1d: float = 0.1  # the fallback's decay, whatever the tensor's group (official)
    clip: str = "tensor"  # tensor (official) | global (levanter) | none
    first_step: str = "zero"  # zero: g_ref = 0, c_1 = (1+kappa) g_1 (official) | plain: c_1 = g_1

    preconditioner: ClassVar[str] = "adam"  # a registered preconditioner (optim/preconditioners)
    fixed_options: ClassVar[dict] = {}  # its options that are not config fields
    # the class build_mars makes: the core or a subclass of it (its own ``correction``; config
    # fields named in its ``adapter_keys`` become group keys); docs/adding-an-optimizer.md
    optimizer_class: ClassVar[type] = VarianceReduced

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.gamma_schedule == "constant" and self.gamma_end != 0.0:
            raise ValueError(
                f"{PREFIX}gamma_end={self.gamma_end} is read only by a gamma schedule: set "
                f"{PREFIX}gamma_schedule=linear (or cosine), or leave gamma_end out"
            )
        self.rule()  # the rule's own checks (every value is valid by now)

    def rule(self) -> Rule:
        """The MARS rule of this config: its preconditioner's options are the fields it has."""
        options = options_from(self.preconditioner, self, **self.fixed_options)
        return mars_rule(self.preconditioner, options, gamma=self.gamma, clip=self.clip,
                         first_step=self.first_step, optimize_1d=self.optimize_1d, lr=self.lr,
                         lr_1d=self.lr_1d, betas_1d=self.betas_1d,
                         weight_decay_1d=self.weight_decay_1d)  # fmt: skip


@dataclass
class MarsAdamWConfig(MarsConfig):
    """MARS-AdamW: the Adam preconditioner on the MARS momentum."""

    amsgrad: bool = False
    second_moment: str = "c"  # c: v from the clipped c (official code) | g: raw gradient (paper)


@dataclass
class MarsLionConfig(MarsConfig):
    """MARS-Lion: sign of the MARS momentum. The official repo publishes no tuned GPT-2 values;
    the lr follows Lion's rule of thumb (about AdamW's / 3)."""

    name: str = "mars-lion"
    lr: float = 2e-4

    preconditioner: ClassVar[str] = "sign"


@dataclass
class MarsShampooConfig(MarsConfig):
    """MARS-Shampoo: Newton-Schulz of the MARS momentum. No tuned GPT-2 values are published;
    the lr is the Muon baseline's (same update scale sqrt(max(1, rows/cols))). With
    ``optimize_1d`` its non-2-D tensors take the mars-adamw rule at the official defaults."""

    name: str = "mars-shampoo"
    lr: float = 2e-2
    ns_steps: int = 5
    ns_dtype: str = "bfloat16"  # Newton-Schulz precision ("param": as p)
    ns_distributed: bool = True  # under DDP each rank orthogonalises a share, then all-gather

    preconditioner: ClassVar[str] = "newton-schulz"
    fixed_options: ClassVar[dict] = {"ns_debias": True}  # NS5(m / (1 - beta1)), as the official


def build_mars(model: nn.Module, cfg: MarsConfig, *, cls: type | None = None,
               ) -> torch.optim.Optimizer:  # fmt: skip
    """Any MARS config: its rule (``cfg.rule()``) on ``cls`` (default ``cfg.optimizer_class``:
    the core or a subclass of it), decay on ``decay_kinds``; the config's fields named in the
    class's ``adapter_keys`` become group keys, and ``gamma_schedule`` the group's schedule."""
    cls = cls or cfg.optimizer_class
    rule = cfg.rule()
    if not (isinstance(cls, type) and issubclass(cls, VarianceReduced)):
        raise TypeError(f"build_mars builds a subclass of optim.VarianceReduced, got {cls!r}")
    # eps in every group: the non-2-D tensors' Adam reads it whatever the preconditioner
    defaults = {"lr": cfg.lr, "betas": tuple(cfg.betas), "weight_decay": cfg.weight_decay,
                "eps": cfg.eps, **rule.group_keys()}  # fmt: skip
    defaults.update({k: v for k, v in config_kwargs(cfg).items() if k in cls.adapter_keys})
    if cfg.gamma_schedule != "constant":
        defaults["schedules"] = {"gamma": (cfg.gamma_schedule, cfg.gamma, cfg.gamma_end)}
    # aux_lr: the fallback's lr is lr * lr_1d_factor, so a factor of 1 puts it at aux_lr too
    groups = split_aux(model, decay_groups(model, cfg.weight_decay, cfg.decay_kinds), cfg.aux_lr,
                       **({"lr_1d_factor": 1.0} if rule.split_1d else {}))  # fmt: skip
    return cls(groups, defaults, is_approx=cfg.mode == "approx",
               implementation=cfg.implementation)  # fmt: skip


register(
    "mars-adamw", MarsAdamWConfig, 'MARS with the Adam preconditioner (the MARS paper\'s "MARS")'
)(build_mars)
register("mars-lion", MarsLionConfig, "MARS with the sign update")(build_mars)
register("mars-shampoo", MarsShampooConfig, "MARS with Newton-Schulz orthogonalisation")(build_mars)


@dataclass
class MarsSoapConfig(MarsConfig, SoapFields):
    """MARS with the SOAP preconditioner (optim/soap.py). No published values: SOAP's own (lr
    3e-3, betas (0.95, 0.95), wd 0.01) with MARS's gamma and official routing (2-D tensors,
    embeddings included, on the MARS rule; the rest on AdamW with ``lr_1d``, ``betas_1d``,
    ``weight_decay_1d``)."""

    name: str = "mars-soap"
    lr: float = 3e-3
    betas: list[float] = field(default_factory=lambda: [0.95, 0.95])

    preconditioner: ClassVar[str] = "soap"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.precondition_1d and not self.optimize_1d:
            raise ValueError(f"{PREFIX}precondition_1d=true needs {PREFIX}optimize_1d=true: "
                             "with MARS's routing the 1-D tensors are on AdamW")  # fmt: skip


@register("mars-soap", MarsSoapConfig, "MARS with the SOAP preconditioner")
def build_mars_soap(model: nn.Module, cfg: MarsSoapConfig) -> torch.optim.Optimizer:
    return build_mars(model, cfg)


@dataclass
class MarsAdEMAMixConfig(MarsConfig, AdEMAMixFields):
    """MARS with the AdEMAMix preconditioner (optim/ademamix.py). No published values:
    AdEMAMix's README values (lr 1e-3, betas (0.9, 0.999), wd 0.1) with MARS's gamma and
    official routing."""

    name: str = "mars-ademamix"
    lr: float = 1e-3
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])

    preconditioner: ClassVar[str] = "ademamix"


register("mars-ademamix", MarsAdEMAMixConfig, "MARS with the AdEMAMix preconditioner")(build_mars)
