"""MARS (Yuan et al., ICML 2025): variance-reduced, clipped momentum in front of a preconditioner.

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
its constructor keywords, so ``from optim import MARS`` is a drop-in. Differences from it:

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

import math

import torch

from optim.functional import (
    CLIP_SCOPES,
    check_betas,
    check_choice,
    check_common,
    clip_unit_norm_,
    mars_correction,
    mars_kappa,
    newton_schulz,
    resolve_dtype,
    shape_scale,
)
from optim.reference import ReferenceGradMixin

MARS_TYPES = ("mars-adamw", "mars-lion", "mars-shampoo")
SECOND_MOMENTS = ("c", "g")
FIRST_STEPS = ("zero", "plain")


class MARS(ReferenceGradMixin, torch.optim.Optimizer):
    """MARS-AdamW / MARS-Lion / MARS-Shampoo, approx or exact; see the module docstring."""

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
        foreach: bool | None = None,
    ):
        check_common(lr, eps, weight_decay, betas)
        check_betas(betas_1d, "betas_1d")
        check_choice(mars_type, MARS_TYPES, "mars_type")
        check_choice(clip, CLIP_SCOPES, "clip")
        check_choice(second_moment, SECOND_MOMENTS, "second_moment")
        check_choice(first_step, FIRST_STEPS, "first_step")
        if gamma < 0:
            raise ValueError(f"gamma must be >= 0, got {gamma}")
        if lr_1d < 0 or weight_decay_1d < 0:
            raise ValueError(
                f"lr_1d and weight_decay_1d must be >= 0, got {lr_1d}, {weight_decay_1d}"
            )
        if ns_steps < 1:
            raise ValueError(f"ns_steps must be >= 1, got {ns_steps}")
        if lr == 0 and lr_1d > 0:
            raise ValueError("lr must be > 0: the 1-D learning rate is applied as lr * lr_1d / lr")
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
            second_moment=second_moment,
            first_step=first_step,
            ns_steps=ns_steps,
            ns_dtype=ns_dtype,
        )
        super().__init__(params, defaults)
        self.clip, self.is_approx, self.foreach = clip, is_approx, foreach
        self._reference_pending = False

    def _uses_reference(self, p: torch.Tensor, group: dict) -> bool:
        return _on_mars(p, group)

    # ----------------------------------------------------------------- the step
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_reference()
        work = [self._prepare_group(group) for group in self.param_groups]
        clip_unit_norm_([c for w in work for c in w["cs"]], self.clip)
        for group, w in zip(self.param_groups, work):
            self._update_mars(group, w)
            self._update_fallback(group, w)
            self._advance_references(w)
        self._reference_pending = False
        return loss

    def _use_foreach(self) -> bool:
        return self.foreach is not False  # foreach is faster on CPU too (scripts/bench_optim.py)

    def _prepare_group(self, group: dict) -> dict:
        """Initialise state, bump step counts and compute the unclipped corrections ``c``."""
        w = {"mars": [], "gs": [], "refs": [], "fallback": [], "fb_gs": []}
        for p in group["params"]:
            if p.grad is None:
                continue
            state, g = self.state[p], p.grad
            mars = _on_mars(p, group)
            if "exp_avg" not in state:
                self._init_state(p, state, group, mars)
            state["step"] += 1
            if mars:
                w["mars"].append(p), w["gs"].append(g), w["refs"].append(state["last_grad"])
            else:
                w["fallback"].append(p), w["fb_gs"].append(g)
        kappa = mars_kappa(group["gamma"], group["betas"][0])
        if self._use_foreach():
            w["cs"] = mars_correction(w["gs"], w["refs"], kappa)
        else:
            w["cs"] = [g + kappa * (g - ref) for g, ref in zip(w["gs"], w["refs"])]
        return w

    def _init_state(self, p: torch.Tensor, state: dict, group: dict, mars: bool) -> None:
        state["step"] = 0
        zeros = lambda: torch.zeros_like(p, memory_format=torch.preserve_format)  # noqa: E731
        state["exp_avg"] = zeros()
        adam_like = (
            not mars
            or group["mars_type"] == "mars-adamw"
            or (group["mars_type"] == "mars-shampoo" and p.ndim != 2)
        )
        if adam_like:
            state["exp_avg_sq"] = zeros()
            if mars and group["amsgrad"]:
                state["max_exp_avg_sq"] = zeros()
        if mars:
            plain = group["first_step"] == "plain"
            state["last_grad"] = p.grad.clone() if plain else zeros()

    def _update_mars(self, group: dict, w: dict) -> None:
        params, cs = w["mars"], w["cs"]
        if not params:
            return
        beta1, beta2 = group["betas"]
        lr, wd = group["lr"], group["weight_decay"]
        states = [self.state[p] for p in params]
        foreach = self._use_foreach()
        _lerp(foreach, [s["exp_avg"] for s in states], cs, 1 - beta1)
        kind = group["mars_type"]
        adam = [
            i for i, p in enumerate(params) if kind == "mars-adamw" or "exp_avg_sq" in states[i]
        ]
        rest = [i for i in range(len(params)) if i not in set(adam)]
        if adam:
            src = cs if group["second_moment"] == "c" else w["gs"]
            _adam_update(
                foreach,
                [params[i] for i in adam],
                [states[i] for i in adam],
                [src[i] for i in adam],
                lr=lr,
                wd=wd,
                betas=(beta1, beta2),
                eps=group["eps"],
                amsgrad=group["amsgrad"],
                update_m=False,
            )
        if kind == "mars-lion" and rest:
            ps, ms = [params[i] for i in rest], [states[i]["exp_avg"] for i in rest]
            _lion_update(foreach, ps, ms, lr, wd)
        elif kind == "mars-shampoo":
            for i in rest:
                p, m = params[i], states[i]["exp_avg"]
                dtype = resolve_dtype(group["ns_dtype"], m)
                o = newton_schulz(m / (1 - beta1), group["ns_steps"], group["eps"], dtype)
                p.add_(o.to(p.dtype) * shape_scale(p.shape) + wd * p, alpha=-lr)

    def _update_fallback(self, group: dict, w: dict) -> None:
        params = w["fallback"]
        if not params:
            return
        _adam_update(
            self._use_foreach(),
            params,
            [self.state[p] for p in params],
            w["fb_gs"],
            lr=group["lr"] * group["lr_1d_factor"],
            wd=group["weight_decay_1d"],
            betas=group["betas_1d"],
            eps=group["eps"],
            amsgrad=False,
            update_m=True,
        )

    def _advance_references(self, w: dict) -> None:
        for p, g in zip(w["mars"], w["gs"]):
            self._advance_reference(self.state[p], g)


def _on_mars(p: torch.Tensor, group: dict) -> bool:
    return group["optimize_1d"] or p.ndim == 2


def _lerp(foreach: bool, ms: list[torch.Tensor], cs: list[torch.Tensor], weight: float) -> None:
    """``m = beta * m + (1 - beta) * c`` with ``weight = 1 - beta``."""
    if foreach:
        torch._foreach_mul_(ms, 1 - weight)
        torch._foreach_add_(ms, cs, alpha=weight)
    else:
        for m, c in zip(ms, cs):
            m.mul_(1 - weight).add_(c, alpha=weight)


def _adam_update(foreach, params, states, srcs, *, lr, wd, betas, eps, amsgrad, update_m) -> None:
    """v from ``srcs``; ``p -= lr * (wd * p + m / ((sqrt(v)/sqrt(bc2) + eps) * bc1))``.

    ``exp_avg`` already holds this step's first moment (MARS branch) or, with ``update_m``
    (the AdamW fallback), is updated here from ``srcs``."""
    beta1, beta2 = betas
    ms = [s["exp_avg"] for s in states]
    vs = [s["exp_avg_sq"] for s in states]
    bc1 = [1 - beta1 ** s["step"] for s in states]
    bc2_sqrt = [math.sqrt(1 - beta2 ** s["step"]) for s in states]
    if foreach:
        if update_m:
            _lerp(True, ms, srcs, 1 - beta1)
        torch._foreach_mul_(vs, beta2)
        torch._foreach_addcmul_(vs, srcs, srcs, value=1 - beta2)
        if amsgrad:
            vmax = [s["max_exp_avg_sq"] for s in states]
            torch._foreach_maximum_(vmax, vs)
            vs = vmax
        denom = torch._foreach_sqrt(vs)
        torch._foreach_div_(denom, bc2_sqrt)
        torch._foreach_add_(denom, eps)
        torch._foreach_mul_(denom, bc1)
        torch._foreach_mul_(params, 1 - lr * wd)
        torch._foreach_addcdiv_(params, ms, denom, value=-lr)
        return
    for i, (p, m, v, src) in enumerate(zip(params, ms, vs, srcs)):
        if update_m:
            m.mul_(beta1).add_(src, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(src, src, value=1 - beta2)
        if amsgrad:
            torch.maximum(states[i]["max_exp_avg_sq"], v, out=states[i]["max_exp_avg_sq"])
            v = states[i]["max_exp_avg_sq"]
        denom = (v.sqrt() / bc2_sqrt[i] + eps) * bc1[i]
        p.add_(wd * p + m / denom, alpha=-lr)


def _lion_update(foreach: bool, params, ms, lr: float, wd: float) -> None:
    """``p -= lr * (wd * p + sign(m))``."""
    if foreach:
        torch._foreach_mul_(params, 1 - lr * wd)
        torch._foreach_add_(params, torch._foreach_sign(ms), alpha=-lr)
    else:
        for p, m in zip(params, ms):
            p.add_(wd * p + torch.sign(m), alpha=-lr)
