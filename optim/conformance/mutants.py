"""A plain MARS-AdamW written from the paper, and deliberately wrong variants of it.

``PlainMARS`` is a third-party-style port (a per-tensor loop, the official constructor's
keywords, ``mars_type="mars-adamw"`` only) that passes the MARS-AdamW vectors. Each mutant
changes one line, as ports of MARS have got it wrong, and the kit must catch it
(tests/test_conformance.py, docs/conformance.md):

- ``AliasedReference``: ``last_grad = p.grad`` without a copy (the official approx code's alias):
  under ``zero_grad(set_to_none=False)`` the reference is the current gradient, so c = g;
- ``UnscaledCorrection``: ``c = g + gamma * (g - g_ref)``, without the ``beta1 / (1 - beta1)``;
- ``ClipBeforeCorrection``: the gradient is clipped to norm 1 and then corrected, c unclipped.
"""

from __future__ import annotations

import math

import torch


class PlainMARS(torch.optim.Optimizer):
    """MARS-AdamW, per tensor: ``c = clip(g + kappa (g - g_ref))``, Adam on c; non-2-D tensors
    AdamW on g with ``betas_1d``, ``weight_decay_1d`` and lr ``lr * lr_1d / lr_init``."""

    def __init__(self, params, lr=3e-3, betas=(0.95, 0.99), eps=1e-8, weight_decay=0.0,
                 gamma=0.025, is_approx=True, mars_type="mars-adamw", optimize_1d=False,
                 lr_1d=3e-3, betas_1d=(0.9, 0.95), weight_decay_1d=0.1):  # fmt: skip
        if mars_type != "mars-adamw" or optimize_1d:
            raise ValueError("PlainMARS implements mars_type='mars-adamw', optimize_1d=False only")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))
        self.eps, self.gamma, self.is_approx = eps, gamma, is_approx
        self.lr_1d_factor, self.betas_1d, self.weight_decay_1d = (
            lr_1d / lr,
            betas_1d,
            weight_decay_1d,
        )

    @torch.no_grad()
    def store_reference_grad(self) -> None:
        """Exact mode: keep ``p.grad`` (the next batch at these weights) for the next step."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self.state[p]["next_ref"] = p.grad.clone()

    def correction(self, g, ref, kappa):
        """``c = g + kappa (g - g_ref)`` clipped to norm <= 1 (the official order)."""
        c = g + kappa * (g - ref)
        return c / max(1.0, float(c.norm()))

    def keep_reference(self, state, g) -> None:
        state["last_grad"] = g.clone()

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, p.grad, group)

    def _update(self, p, g, group) -> None:
        state = self.state[p]
        if "step" not in state:
            state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p),
                         last_grad=torch.zeros_like(p))  # fmt: skip
        state["step"] += 1
        lr, t = group["lr"], state["step"]
        if p.ndim == 2:
            (b1, b2), wd = group["betas"], group["weight_decay"]
            g_in = self.correction(g, state["last_grad"], self.gamma * b1 / (1 - b1))
        else:
            (b1, b2), wd = self.betas_1d, self.weight_decay_1d
            lr, g_in = lr * self.lr_1d_factor, g
        state["exp_avg"].mul_(b1).add_(g_in, alpha=1 - b1)
        state["exp_avg_sq"].mul_(b2).addcmul_(g_in, g_in, value=1 - b2)
        denom = (state["exp_avg_sq"].sqrt() / math.sqrt(1 - b2**t) + self.eps) * (1 - b1**t)
        p.add_(wd * p + state["exp_avg"] / denom, alpha=-lr)
        if p.ndim == 2:
            if self.is_approx:
                self.keep_reference(state, g)
            elif "next_ref" in state:
                state["last_grad"] = state.pop("next_ref")


class AliasedReference(PlainMARS):
    """Keeps ``p.grad`` itself as the reference (no copy)."""

    def keep_reference(self, state, g) -> None:
        state["last_grad"] = g


class UnscaledCorrection(PlainMARS):
    """``c = g + gamma (g - g_ref)``: the ``beta1 / (1 - beta1)`` factor left out."""

    def correction(self, g, ref, kappa):
        return super().correction(g, ref, self.gamma)


class ClipBeforeCorrection(PlainMARS):
    """Clips the gradient, then corrects: ``c = clip(g) + kappa (clip(g) - g_ref)``."""

    def correction(self, g, ref, kappa):
        g = g / max(1.0, float(g.norm()))
        return g + kappa * (g - ref)


MUTANTS = {
    "aliased-reference": AliasedReference,
    "unscaled-correction": UnscaledCorrection,
    "clip-before-correction": ClipBeforeCorrection,
}
