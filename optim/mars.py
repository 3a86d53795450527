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
``mars_type``. The registry builds MARS configs with ``build_mars`` (optim/builders.py), which
takes any registered preconditioner (docs/adding-an-optimizer.md), not only these three. Differences from the official code:

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

from optim.core import VarianceReduced
from optim.options import check_option, choice
from optim.preconditioners import AdamOptions, NewtonSchulzOptions
from optim.rule import Rule, Split1D, VarianceReduction

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
        foreach: bool | None = None,
        fused: bool | None = None,
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
        super().__init__(params, defaults, is_approx=is_approx, foreach=foreach, fused=fused)

    def add_param_group(self, param_group: dict) -> None:
        """A group's own ``mars_type`` / ``optimize_1d`` pick its rule (as the official code)."""
        group = {**self.defaults, **param_group}
        check_option("mars_type", group["mars_type"])
        group["preconditioner"] = MARS_TYPES[group["mars_type"]]
        group["split_1d"] = not group["optimize_1d"]
        super().add_param_group(group)
