"""How the kit drives an implementation: the ``Driver`` interface and its torch.optim form.

A port is reached through a hook ``make(params, settings)``: ``params`` maps each tensor name of
the vector to a fresh float64 leaf tensor (the starting weights), ``settings`` is the vector's
manifest entry (official keywords in ``kwargs``, the routing in ``groups`` / ``muon_params`` /
``adamw_params``, ``mode``). The hook returns either

- a ``torch.optim.Optimizer`` over those tensors: the kit wraps it in ``TorchDriver``; or
- a ``Driver`` (e.g. ``TorchDriver`` with its options, or an object of your own for a functional
  port that keeps its weights elsewhere): anything with the four methods below.

Per iteration the kit calls ``set_lr`` (the lr the official script wrote into the group of each
tensor), then in exact mode ``reference`` (the look-ahead gradient, which becomes the reference
of the *next* step), then ``step`` (this step's gradients), then reads ``values``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

Tensors = dict[str, torch.Tensor]


class Driver(Protocol):
    """What the kit calls; every dict is keyed by the vector's tensor names."""

    def set_lr(self, lrs: dict[str, float]) -> None: ...

    def reference(self, grads: Tensors) -> None: ...

    def step(self, grads: Tensors) -> None: ...

    def values(self) -> Tensors: ...


class TorchDriver:
    """Drives a ``torch.optim.Optimizer`` as a training loop does.

    Gradients go into the ``p.grad`` buffers the way ``loss.backward()`` puts them there: added
    into the buffer left by ``zero_grad(set_to_none=False)`` (the default here, ``set_to_none``
    False), so a reference gradient kept as an alias of ``p.grad`` is caught. ``reference``: how
    the optimizer takes the exact-mode look-ahead gradient from ``p.grad``; None picks
    ``store_reference_grad()`` (this project) or the official pair ``update_previous_grad()``
    before the step and ``update_last_grad()`` after it.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, params: Tensors, *,
                 reference: Callable[[torch.optim.Optimizer], None] | None = None,
                 set_to_none: bool = False):  # fmt: skip
        self.optimizer, self.params, self.set_to_none = optimizer, params, set_to_none
        self._reference, self._after_step = reference, None
        self._name = {id(p): n for n, p in params.items()}

    def set_lr(self, lrs: dict[str, float]) -> None:
        for group in self.optimizer.param_groups:
            values = {lrs[self._name[id(p)]] for p in group["params"] if id(p) in self._name}
            if len(values) > 1:
                raise ValueError(f"a param group mixes tensors whose official lrs differ "
                                 f"({sorted(values)}); split it by the vector's routing")  # fmt: skip
            if values:
                group["lr"] = values.pop()

    def reference(self, grads: Tensors) -> None:
        self._put(grads)
        opt = self.optimizer
        if self._reference is not None:
            self._reference(opt)
        elif hasattr(opt, "store_reference_grad"):
            opt.store_reference_grad()
        elif hasattr(opt, "update_previous_grad"):
            opt.update_previous_grad()
            self._after_step = getattr(opt, "update_last_grad", None)
        else:
            raise ValueError(f"{type(opt).__name__} has no store_reference_grad or "
                             "update_previous_grad: pass TorchDriver(reference=...)")  # fmt: skip
        opt.zero_grad(set_to_none=self.set_to_none)

    def step(self, grads: Tensors) -> None:
        self._put(grads)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=self.set_to_none)
        if self._after_step is not None:
            self._after_step()

    def values(self) -> Tensors:
        return {n: p.detach() for n, p in self.params.items()}

    def _put(self, grads: Tensors) -> None:
        for name, p in self.params.items():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad.add_(grads[name])  # accumulate into the zeroed buffer, as backward does


def _tuples(kwargs: dict) -> dict:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()}


def official_args(settings: dict, params: Tensors) -> tuple[list, dict]:
    """``(args, kwargs)`` of the official constructor call for layouts ``groups`` and
    ``muon_adamw`` (specs.py): what a drop-in class with the official signature takes."""
    kwargs = _tuples(settings["kwargs"])
    if settings["layout"] == "groups":
        groups = [{**g, "params": [params[n] for n in g["params"]]} for g in settings["groups"]]
        return [groups], kwargs
    if settings["layout"] == "muon_adamw":
        return [], {**kwargs, "muon_params": [params[n] for n in settings["muon_params"]],
                    "adamw_params": [params[n] for n in settings["adamw_params"]]}  # fmt: skip
    raise ValueError(f"layout {settings['layout']!r} has no single official constructor")


def muon_args(settings: dict, params: Tensors) -> tuple[list, dict]:
    """The ``combined`` layout (the MARS repo's Muon + AdamW) as this project's ``Muon``
    keywords: Muon's ``lr``, ``weight_decay`` and the AdamW part's as ``adamw_*``."""
    adamw = _tuples(settings["adamw_kwargs"])
    kwargs = {**_tuples(settings["kwargs"]), "adamw_params": [params[n] for n in
              settings["adamw_params"]], **{f"adamw_{k}": v for k, v in adamw.items()}}  # fmt: skip
    return [[params[n] for n in settings["muon_params"]]], kwargs


def make_dropin(cls: type) -> Callable[[Tensors, dict], Any]:
    """The hook for a class that takes the official constructor's keywords (this project's
    ``MARS``, ``MARS_M``, ``MARS_M_Efficient``, ``Moonlight``, ``Muon``)."""

    def make(params: Tensors, settings: dict):
        build = muon_args if settings["layout"] == "combined" else official_args
        args, kwargs = build(settings, params)
        return cls(*args, **kwargs)

    make.__name__ = f"make_{cls.__name__}"
    return make
