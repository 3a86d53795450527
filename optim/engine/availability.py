"""Whether the engine runs: what ``implementation`` asks (optim/implementation.py), Triton's
availability."""

from __future__ import annotations

import logging

import torch

from optim import implementation as implementations
from optim.engine import loader
from optim.engine.state import of as state_of

log = logging.getLogger("optim.engine")


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


def wanted(implementation: str, device_type: str) -> bool:
    """Whether an optimizer with this ``implementation`` asks for the engine on the device."""
    return implementations.engine_wanted(implementation, device_type)


def usable(opt, device_type: str) -> bool:
    """Whether ``opt`` runs its covered buckets on the engine now (logs why not, once, when
    the engine was asked for by name)."""
    if not wanted(opt.implementation, device_type) or state_of(opt).off:
        return False
    reason = unavailable_reason(device_type)
    if reason is None and getattr(opt, "private_overrides", list)():
        reason = f"{type(opt).__name__} overrides {opt.private_overrides()}"
    if reason is None:
        return True
    if opt.implementation == "triton":
        state_of(opt).off = reason
        log.warning("optimizer engine off (%s); using the other paths", reason)
    return False


def kernels_for(device_type: str):
    return loader.kernels(loader.mode_for(device_type))
