"""Learning-rate schedules: each maps (step, peak lr) to an absolute learning rate.

- ``cosine`` (the papers'): linear warmup from 0 over ``warmup_steps`` (lr = peak * step / warmup,
  so step 0 has lr 0), then ``min_lr + 0.5 * (1 + cos(pi * r)) * (peak - min_lr)`` with
  ``r = (step - warmup) / (decay_steps - warmup)``, and ``min_lr`` after ``decay_steps``.
  ``min_lr`` is absolute, as in the official configs, so groups with a different peak share it;
  ``min_lr_ratio`` instead ends each group at that fraction of its own peak, so optimizers (and
  groups) with different peaks decay alike (the optimizer study, docs/study.md).
- ``wsd`` (warmup-stable-decay): warmup, the peak until the last ``decay_frac`` of the steps,
  then linear to ``min_lr`` at ``decay_steps``. The official scripts' wsd ends at 0 whatever
  their min_lr: set ``schedule.min_lr=0`` to match them.
- ``constant``: warmup, then the peak.

Schedules set ``group["lr"]`` from ``group["initial_lr"]`` (torch's key for a group's peak).

Any other numeric key of a param group (``gamma`` first: how gamma should change over a run is a
question the MARS papers leave open) may follow a schedule too: the group's ``schedules`` key maps
it to ``(shape, start, end)``, and ``apply_schedule`` sets, each step,

    group[key] = start + (end - start) * shape(r),   r = min(1, step / horizon)

with ``horizon`` the lr schedule's (``decay_steps``, else the run's ``max_steps``) and ``shape``
one of ``HYPER_SHAPES``: ``constant`` (0: stays at start), ``linear`` (r), ``cosine``
((1 - cos(pi r)) / 2). Every path of the core (loop, foreach, compiled) reads the group's value
at each step, so a schedule needs no code in the optimizer; MARS configs expose it as
``optimizer.gamma_schedule`` and ``optimizer.gamma_end`` (optim/mars.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from optim.options import check_option, choice

SCHEDULES = ("cosine", "wsd", "constant")
# the fraction of the way from ``start`` to ``end`` at progress r in [0, 1]
HYPER_SHAPES: dict[str, Callable[[float], float]] = {
    "constant": lambda r: 0.0,
    "linear": lambda r: r,
    "cosine": lambda r: 0.5 * (1.0 - math.cos(math.pi * r)),
}
choice("gamma_schedule", HYPER_SHAPES)  # MARS configs' field (optim/mars.py)


@dataclass
class ScheduleConfig:
    name: str = "cosine"
    warmup_steps: int = 0
    min_lr: float = 0.0
    decay_steps: int | None = None  # None: the run's max_steps (official lr_decay_iters)
    decay_frac: float = 0.2  # wsd only: fraction of decay_steps spent decaying
    min_lr_ratio: float | None = None  # set: each group ends at this fraction of its peak

    def __post_init__(self) -> None:
        if self.name not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.name!r}; valid schedules: {list(SCHEDULES)}")
        if self.warmup_steps < 0:
            raise ValueError(f"schedule.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.min_lr < 0:
            raise ValueError(f"schedule.min_lr must be >= 0, got {self.min_lr}")
        if self.min_lr_ratio is not None and not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"schedule.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.min_lr_ratio is not None and self.min_lr > 0:
            raise ValueError(
                "schedule.min_lr and schedule.min_lr_ratio are both set; keep one "
                "(schedule.min_lr=0 with a ratio)"
            )
        if not 0.0 < self.decay_frac <= 1.0:
            raise ValueError(f"schedule.decay_frac must be in (0, 1], got {self.decay_frac}")


def lr_at(step: int, peak_lr: float, cfg: ScheduleConfig, max_steps: int) -> float:
    """The learning rate of optimizer step ``step`` (0-based) for a group whose peak is ``peak_lr``."""
    decay_steps = cfg.decay_steps or max_steps
    floor = cfg.min_lr if cfg.min_lr_ratio is None else cfg.min_lr_ratio * peak_lr
    if step < cfg.warmup_steps:
        return peak_lr * step / cfg.warmup_steps
    if cfg.name == "constant":
        return peak_lr
    if step >= decay_steps:
        return floor
    if cfg.name == "cosine":
        ratio = (step - cfg.warmup_steps) / max(1, decay_steps - cfg.warmup_steps)
        return floor + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (peak_lr - floor)
    # wsd
    decay_start = decay_steps - cfg.decay_frac * decay_steps
    if step < decay_start:
        return peak_lr
    frac = (decay_steps - step) / (decay_steps - decay_start)
    return floor + frac * (peak_lr - floor)


def set_initial_lr(optimizer: torch.optim.Optimizer) -> None:
    """Record each group's configured lr as its peak (``initial_lr``) unless already set."""
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])


def apply_schedule(
    optimizer: torch.optim.Optimizer, step: int, cfg: ScheduleConfig, max_steps: int
) -> float:
    """Set every group's lr for ``step``, and each key its ``schedules`` name (module
    docstring); returns the lr of the first group (for logging)."""
    horizon = cfg.decay_steps or max_steps
    for group in optimizer.param_groups:
        group["lr"] = lr_at(step, group["initial_lr"], cfg, max_steps)
        apply_hyper_schedules(group, step, horizon)
    return optimizer.param_groups[0]["lr"]


def hyper_value(spec, step: int, horizon: int) -> float:
    """The value of a ``(shape, start, end)`` schedule at ``step`` of ``horizon``."""
    shape, start, end = spec
    r = min(1.0, step / max(1, horizon))
    return start + (end - start) * HYPER_SHAPES[shape](r)


def apply_hyper_schedules(group: dict, step: int, horizon: int) -> None:
    """Set each key of ``group["schedules"]`` (if any) to its value at ``step``."""
    for key, spec in group.get("schedules", {}).items():
        group[key] = hyper_value(spec, step, horizon)


def check_hyper_schedules(group: dict, where: str = "param group") -> None:
    """A group's ``schedules``: each key a number the group holds, a known shape, and a start
    and end that the key's own validator accepts."""
    schedules = group.get("schedules", {})
    if not isinstance(schedules, dict):
        raise ValueError(f"schedules in {where} must map a key to (shape, start, end), "
                         f"got {schedules!r}")  # fmt: skip
    for key, spec in schedules.items():
        value = group.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"schedules in {where}: {key!r} is not a number of the group "
                             f"(got {value!r}); only numeric keys can follow a schedule")  # fmt: skip
        if len(spec) != 3 or spec[0] not in HYPER_SHAPES:
            raise ValueError(f"schedules[{key!r}] in {where} must be (shape, start, end) with "
                             f"shape one of {list(HYPER_SHAPES)}, got {spec!r}")  # fmt: skip
        check_option(key, spec[1], f"{key} (schedule start)")
        check_option(key, spec[2], f"{key} (schedule end)")
