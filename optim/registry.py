"""The optimizer registry: a name maps to a typed config class and a builder.

``build_optimizer(model, cfg)`` is the one entry point the training loop uses; ``cfg.name`` picks
the optimizer. Adding an optimizer is one ``@register`` call (docs/adding-an-optimizer.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

Builder = Callable[[nn.Module, Any], torch.optim.Optimizer]


@dataclass(frozen=True)
class OptimizerSpec:
    name: str
    config_cls: type
    build: Builder
    description: str


_REGISTRY: dict[str, OptimizerSpec] = {}


def register(name: str, config_cls: type, description: str) -> Callable[[Builder], Builder]:
    """Decorator registering ``build(model, cfg) -> Optimizer`` under ``name``."""

    def wrap(build: Builder) -> Builder:
        if name in _REGISTRY:
            raise ValueError(f"optimizer {name!r} is registered twice")
        _REGISTRY[name] = OptimizerSpec(name, config_cls, build, description)
        return build

    return wrap


def available() -> list[str]:
    """Names of every registered optimizer, sorted."""
    return sorted(_REGISTRY)


def get_spec(name: str) -> OptimizerSpec:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown optimizer {name!r}; valid optimizers: {', '.join(available())}"
        ) from None


def build_optimizer(model: nn.Module, cfg: Any) -> torch.optim.Optimizer:
    """Build the optimizer named ``cfg.name`` for ``model`` from its typed config."""
    spec = get_spec(cfg.name)
    if not isinstance(cfg, spec.config_cls):
        raise TypeError(f"optimizer {cfg.name!r} expects a {spec.config_cls.__name__}")
    return spec.build(model, cfg)
