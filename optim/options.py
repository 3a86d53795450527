"""Every option of every optimizer here, each with its one validator (one rule, one message),
and ``OptimizerConfig``, the fields every registered optimizer's config shares.

A validator takes ``(value, key)`` and raises ``ValueError`` naming ``key`` as the caller shows
it: ``optimizer.lr`` for a config field (the prefix is the config's), ``lr`` for a constructor
keyword or a param group's key. Names that mean the same knob share its validator through
``ALIASES`` (``adamw_betas`` and ``betas_1d`` are betas, ``lr_1d`` and ``adamw_lr`` are lrs).

- ``check_fields(obj, prefix)``: every field of a dataclass (a ``*Config``, a preconditioner's
  ``Options``) that has a validator.
- ``check_option(name, value)``: one keyword of a drop-in constructor that is not a group key.
- ``check_group_keys(group, allowed)``: a param group may hold only keys the rule reads, so that a
  misspelt option (``ns_step``) is an error instead of a silent default.

A new option gets its validator with ``@validator("name")`` next to the code that reads it.
Each optimizer's typed config (an ``OptimizerConfig``) sits beside the class or rule it configures
(``MarsConfig`` in optim/mars.py, ``MuonConfig`` in optim/muon.py, ``MoonlightConfig`` in
optim/moonlight.py, ...); its defaults are the optimizer's values, each with its source.
``config_kwargs(cfg)`` passes its fields on as keywords.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import torch

from optim import implementation as implementations

Validator = Callable[[Any, str], None]
VALIDATORS: dict[str, Validator] = {}
ALIASES = {
    "lr_1d": "lr",
    "adamw_lr": "lr",
    "betas_1d": "betas",
    "adamw_betas": "betas",
    "adamw_eps": "eps",
    "weight_decay_1d": "weight_decay",
    "adamw_weight_decay": "weight_decay",
    "wd": "weight_decay",
    "gamma_end": "gamma",
}
CLIP_SCOPES = ("tensor", "global", "none")
FIRST_STEPS = ("zero", "plain")
MODES = ("approx", "exact")


def validator(*names: str) -> Callable[[Validator], Validator]:
    """Register ``check(value, key)`` as the one validator of the options ``names``."""

    def wrap(check: Validator) -> Validator:
        for name in names:
            if name in VALIDATORS:
                raise ValueError(f"option {name!r} has a validator already")
            VALIDATORS[name] = check
        return check

    return wrap


def choice(name: str, valid: Iterable[str]) -> None:
    """Register the validator of an option that takes one of ``valid``."""
    valid = tuple(valid)

    def check(value: Any, key: str) -> None:
        if value not in valid:
            raise ValueError(f"unknown {key} {value!r}; valid values: {list(valid)}")

    validator(name)(check)


def check_option(name: str, value: Any, key: str | None = None) -> None:
    """Validate ``value`` of option ``name`` (shown as ``key``), if the option has a validator."""
    check = VALIDATORS.get(ALIASES.get(name, name))
    if check is not None:
        check(value, key or name)


def check_fields(obj: Any, prefix: str = "") -> None:
    """Validate every field of the dataclass ``obj`` that has a validator (named ``prefix+name``)."""
    for f in dataclasses.fields(obj):
        check_option(f.name, getattr(obj, f.name), prefix + f.name)


PREFIX = "optimizer."  # config errors name the full key (optimizer.lr)


@dataclasses.dataclass
class OptimizerConfig:
    """What every registered optimizer's config has: its registry ``name``, the peak ``lr``,
    ``weight_decay``, and ``aux_lr``, the one second lr with one meaning everywhere
    (docs/optimizers.md): the peak lr of every parameter that is not a block matrix (embedding =
    tied head, untied head, positions, gains, biases), whatever rule it is on; None: the
    optimizer's own lrs. ``implementation``: how it steps (optim/implementation.py), one of the
    class's ``valid_implementations``; the builder passes it on. Each subclass sets its own
    defaults; every field is validated when the config is made."""

    name: str = ""
    lr: float = 1e-3
    weight_decay: float = 0.0
    aux_lr: float | None = None
    implementation: str = implementations.DEFAULT  # auto | loop | foreach | compiled | triton

    valid_implementations: ClassVar[tuple[str, ...]] = implementations.CORE

    def __post_init__(self) -> None:
        implementations.check(self.implementation, self.valid_implementations,
                              f"{PREFIX}implementation", self.name)  # fmt: skip
        check_fields(self, PREFIX)


def config_kwargs(cfg: Any, *skip: str) -> dict[str, Any]:
    """The config's fields as keyword arguments (lists as tuples), less ``name`` and ``skip``."""
    out = {}
    for f in dataclasses.fields(cfg):
        if f.name not in ("name", *skip):
            value = getattr(cfg, f.name)
            out[f.name] = tuple(value) if isinstance(value, list) else value
    return out


def check_group_keys(group: dict, allowed: Iterable[str], where: str) -> None:
    """Refuse keys of ``group`` outside ``allowed``, with the closest valid key."""
    allowed = set(allowed)
    for key in group:
        if key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ValueError(f"unknown option {key!r} in {where}{hint}; valid: {sorted(allowed)}")


def _at_least(bound: float, strict: bool) -> Validator:
    def check(value: Any, key: str) -> None:
        if not math.isfinite(value):
            raise ValueError(f"{key} must be a finite number, got {value}")
        if not (value > bound if strict else value >= bound):
            raise ValueError(f"{key} must be {'>' if strict else '>='} {bound:g}, got {value}")

    return check


validator("lr")(_at_least(0, strict=True))  # a run at lr 0 learns nothing: one rule, > 0
validator("eps")(_at_least(0, strict=True))
validator("weight_decay")(_at_least(0, strict=False))
validator("gamma")(_at_least(0, strict=False))


@validator("aux_lr")
def _aux_lr(value: Any, key: str) -> None:
    """Every registered optimizer's second lr (docs/optimizers.md): None (unset) or an lr."""
    if value is not None:
        check_option("lr", value, key)


@validator("betas")
def _betas(value: Any, key: str) -> None:
    if len(value) != 2 or not all(0.0 <= b < 1.0 for b in value):
        raise ValueError(f"{key} must be two numbers in [0, 1), got {tuple(value)}")


@validator("momentum")
def _momentum(value: Any, key: str) -> None:
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{key} must be in [0, 1), got {value}")


@validator("ns_steps")
def _ns_steps(value: Any, key: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be >= 1 (an integer), got {value}")


@validator("ns_dtype")
def _ns_dtype(value: Any, key: str) -> None:
    if value != "param" and not isinstance(getattr(torch, str(value), None), torch.dtype):
        raise ValueError(f"{key} {value!r}: use 'param', 'bfloat16' or 'float32'")


choice("clip", CLIP_SCOPES)
choice("first_step", FIRST_STEPS)
choice("mode", MODES)
