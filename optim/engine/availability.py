"""Whether the engine runs: the ``fused`` switch, its validator, Triton's availability."""

from __future__ import annotations

import logging

import torch

from optim.engine import loader
from optim.engine.state import of as state_of
from optim.options import validator

ENGINE = "engine"
FUSED_CHOICES = (None, True, False, ENGINE)
log = logging.getLogger("optim.engine")


@validator("fused")
def check_fused(value, key: str = "fused") -> None:
    """The one validator of ``fused`` (optim/options.py): None, True, False or "engine"."""
    if value not in FUSED_CHOICES or (value is not None and not isinstance(value, bool | str)):
        raise ValueError(f"{key} must be one of None, true, false or 'engine', got {value!r}")


def unavailable_reason(device_type: str) -> str | None:
    """Why the engine cannot run on ``device_type`` here, or None."""
    if loader.mode_for(device_type) is None:
        return f"device type {device_type!r} is not covered by the engine (cuda, cpu)"
    missing = loader.triton_missing()
    if missing:
        return missing
    if device_type == "cuda" and not torch.cuda.is_available():
        return "CUDA is not available"
    return None


def wanted(fused, device_type: str) -> bool:
    """Whether an optimizer with this ``fused`` setting asks for the engine on the device."""
    return fused == ENGINE or (fused is None and device_type == "cuda")


def usable(opt, device_type: str) -> bool:
    """Whether ``opt`` runs its covered buckets on the engine now (logs why not, once, when
    the engine was asked for by name)."""
    if not wanted(opt.fused, device_type) or state_of(opt).off:
        return False
    reason = unavailable_reason(device_type)
    if reason is None and getattr(opt, "private_overrides", list)():
        reason = f"{type(opt).__name__} overrides {opt.private_overrides()}"
    if reason is None:
        return True
    if opt.fused == ENGINE:
        state_of(opt).off = reason
        log.warning("optimizer engine off (%s); using the other paths", reason)
    return False


def kernels_for(device_type: str):
    return loader.kernels(loader.mode_for(device_type))
