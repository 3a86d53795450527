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
its constructor keywords, so ``from optim import MARS`` is a drop-in. It builds param groups for
the core (optim/core.py): momentum ``ema``, preconditioner ``adam`` / ``sign`` /
``newton-schulz``. Differences from the official code:

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
from optim.functional import CLIP_SCOPES, check_betas, check_choice, check_common
from optim.preconditioners import SECOND_MOMENTS

MARS_TYPES = {"mars-adamw": "adam", "mars-lion": "sign", "mars-shampoo": "newton-schulz"}
FIRST_STEPS = ("zero", "plain")


class MARS(VarianceReduced):
    """MARS-AdamW / MARS-Lion / MARS-Shampoo, approx or exact; see the module docstring."""

    default_foreach = True  # foreach is faster on CPU too (bench/optim.py)

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
        check_common(lr, eps, weight_decay, betas)
        _check(mars_type, clip, second_moment, first_step, gamma, lr, lr_1d, weight_decay_1d)
        check_betas(betas_1d, "betas_1d")
        if ns_steps < 1:
            raise ValueError(f"ns_steps must be >= 1, got {ns_steps}")
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            gamma=gamma,
            mars_type=mars_type,
            optimize_1d=optimize_1d,
            lr_1d_factor=lr_1d / lr if lr > 0 else 0.0,  # frozen here, as the official code
            betas_1d=tuple(betas_1d),
            weight_decay_1d=weight_decay_1d,
            clip=clip,
            second_moment=second_moment,
            first_step=first_step,
            ns_steps=ns_steps,
            ns_dtype=ns_dtype,
            ns_distributed=ns_distributed,  # optim/newton_schulz.py
            # the core's rule (optim/core.py)
            variance_reduction=True,
            momentum_form="ema",
            eps_placement="after_sqrt_v_hat",
            ns_debias=True,  # NS5(m / (1 - beta1)), as the official code
            scale="shape",
        )
        super().__init__(params, defaults, is_approx=is_approx, foreach=foreach, fused=fused)
        for group in self.param_groups:  # a group may set its own mars_type / optimize_1d
            check_choice(group["mars_type"], MARS_TYPES, "mars_type")
            group["split_1d"] = not group["optimize_1d"]
            group["preconditioner"] = MARS_TYPES[group["mars_type"]]


def _check(mars_type, clip, second_moment, first_step, gamma, lr, lr_1d, weight_decay_1d) -> None:
    """Reject the drop-in's bad values, naming the value and what is allowed."""
    check_choice(mars_type, MARS_TYPES, "mars_type")
    check_choice(clip, CLIP_SCOPES, "clip")
    check_choice(second_moment, SECOND_MOMENTS, "second_moment")
    check_choice(first_step, FIRST_STEPS, "first_step")
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    if lr_1d < 0 or weight_decay_1d < 0:
        raise ValueError(f"lr_1d and weight_decay_1d must be >= 0, got {lr_1d}, {weight_decay_1d}")
    if lr == 0 and lr_1d > 0:
        raise ValueError("lr must be > 0: the 1-D learning rate is applied as lr * lr_1d / lr")
