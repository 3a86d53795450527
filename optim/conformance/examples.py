"""Adapters for ports that do not take the official constructor: two worked examples.

- ``make_timm_style(cls)``: a ``torch.optim`` class with other keyword names (timm's ``Mars``:
  ``lr, betas, eps, weight_decay, gamma, mars_type="adamw", optimize_1d, lr_1d_factor,
  betas_1d, caution``). Check the names against the version you test.
- ``make_functional``: an optax-style port, pure ``init(params)`` and
  ``update(grads, state, params, lr) -> (updates, state)`` over dicts of tensors, wrapped in a
  ``Driver`` (adapters.py) that keeps the weights, feeds the exact-mode reference and applies
  the updates. ``functional_mars_adamw`` is a small port of that shape (MARS-AdamW).

    python -m optim.conformance optim.conformance.examples:make_functional
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from optim.conformance.adapters import Tensors, TorchDriver, official_args


def make_timm_style(cls: type) -> Callable:
    """A hook for a timm-style MARS class (groups layout: the MARS vectors)."""

    def make(params: Tensors, settings: dict):
        [groups], kw = official_args(settings, params)
        port = cls(groups, lr=kw["lr"], betas=kw["betas"], gamma=kw["gamma"],
                   mars_type=kw["mars_type"].removeprefix("mars-"),
                   optimize_1d=kw["optimize_1d"], lr_1d_factor=kw["lr_1d"] / kw["lr"],
                   betas_1d=kw["betas_1d"], caution=False)  # fmt: skip
        # timm's Mars has no exact mode (the vectors below are approx). A port that has one names
        # the method that takes the look-ahead gradient from p.grad, e.g.:
        return TorchDriver(port, params, reference=lambda opt: opt.update_previous_grad())

    make.vectors = ["mars-adamw-approx", "mars-lion-approx"]
    return make


def functional_mars_adamw(settings: dict):
    """``(init, update)`` of MARS-AdamW as pure functions (routing read from ``settings``)."""
    kw = settings["kwargs"]
    wd = {n: g["weight_decay"] for g in settings["groups"] for n in g["params"]}
    (b1, b2), kappa = kw["betas"], kw["gamma"] * kw["betas"][0] / (1 - kw["betas"][0])

    def init(params: Tensors) -> dict:
        zeros = {n: torch.zeros_like(p) for n, p in params.items()}
        return {"t": 0, "m": dict(zeros), "v": dict(zeros), "ref": dict(zeros)}

    def update(grads: Tensors, state: dict, params: Tensors, lr: dict, refs=None):
        """One step; ``refs``: the exact-mode references (None: approx, the previous g)."""
        t, out, new = state["t"] + 1, {}, {"m": {}, "v": {}, "ref": {}}
        for n, g in grads.items():
            if g.ndim == 2:
                c = g + kappa * (g - (state["ref"] if refs is None else refs)[n])
                c, (c1, c2), lam, rate = c / max(1.0, float(c.norm())), (b1, b2), wd[n], lr[n]
            else:
                c, (c1, c2), lam = g, kw["betas_1d"], kw["weight_decay_1d"]
                rate = lr[n] * kw["lr_1d"] / kw["lr"]
            m = c1 * state["m"][n] + (1 - c1) * c
            v = c2 * state["v"][n] + (1 - c2) * c * c
            denom = (v.sqrt() / math.sqrt(1 - c2**t) + kw.get("eps", 1e-8)) * (1 - c1**t)
            out[n] = -rate * (lam * params[n] + m / denom)
            new["m"][n], new["v"][n] = m, v
            new["ref"][n] = g.clone()  # approx mode's reference for the next step
        return out, {"t": t, **new}

    return init, update


class FunctionalDriver:
    """The ``Driver`` for an optax-style ``(init, update)`` pair: it owns the weights, and in
    exact mode holds the look-ahead gradient one iteration before passing it as ``refs``."""

    def __init__(self, init: Callable, update: Callable, params: Tensors):
        self.update, self.params = update, {n: p.detach().clone() for n, p in params.items()}
        self.state, self.lr = init(self.params), {}
        self.refs = {n: torch.zeros_like(p) for n, p in self.params.items()}  # step 1: zero
        self.lookahead = None

    def set_lr(self, lrs: dict[str, float]) -> None:
        self.lr = lrs

    def reference(self, grads: Tensors) -> None:
        self.lookahead = {n: g.clone() for n, g in grads.items()}  # the next step's reference

    def step(self, grads: Tensors) -> None:
        refs = None if self.lookahead is None else self.refs
        updates, self.state = self.update(grads, self.state, self.params, self.lr, refs)
        self.params = {n: p + updates[n] for n, p in self.params.items()}
        if self.lookahead is not None:
            self.refs, self.lookahead = self.lookahead, None

    def values(self) -> Tensors:
        return self.params


def make_functional(params: Tensors, settings: dict) -> FunctionalDriver:
    """The hook: ``python -m optim.conformance optim.conformance.examples:make_functional``."""
    return FunctionalDriver(*functional_mars_adamw(settings), params)


make_functional.vectors = ["mars-adamw-*"]
