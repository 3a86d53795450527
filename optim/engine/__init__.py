"""The optimizer engine: every covered element-wise rule of the core in a few Triton kernels.

``VarianceReduced(..., implementation=...)`` (optim/core.py, optim/implementation.py) asks for it and
optim/routes.py's ``decide`` gives it the buckets it takes (``refusal``):

- ``auto`` (default): the engine on CUDA where Triton is importable, for the buckets it
  covers (optim/engine/rules.py); the others take the compiled step, then foreach. On a CPU
  nothing changes: foreach (or the per-tensor loop).
- ``triton``: the engine on any device: CUDA compiled, a CPU through Triton's
  interpreter (optim/engine/loader.py; slow, exact, for tests). Without Triton it logs why
  once (``off_reason``) and the buckets take their usual path.
- ``compiled``: the compiled step (optim/compiled.py), not the engine; ``loop``, ``foreach``: neither.

Each step of a covered bucket is one ``step_kernel`` launch (plus a norm pass and its finish when
the MARS correction is clipped), over pointer tables built once per bucket
(optim/engine/tables.py) with the hyperparameters as scalar arguments. ``opt.last_routes``
(optim/routes.py) records ``engine`` for every bucket it ran. Importing this package imports no
Triton: the kernels are loaded the first time the engine runs.
"""

from __future__ import annotations

import torch

from optim.engine.availability import (
    kernels_for,
    unavailable_reason,
    usable,
    wanted,
)

__all__ = ["covers", "kept_device", "kernels_for", "refusal", "run", "run_kept",
           "setting_refusal", "unavailable_reason", "usable", "wanted"]  # fmt: skip


def run(opt, buckets: list, skip: torch.Tensor | None, gscale: torch.Tensor | None = None,
        *, whole: bool = False) -> list:  # fmt: skip
    """Step the buckets the engine covers; returns the others (for the compiled/eager paths).
    ``gscale``: the trainer's global clip folded into the step (optim/engine/clip.py), or None.
    ``whole``: ``buckets`` are every bucket of the step (only then may its launches be kept for
    the next steps: optim/engine/steady.py)."""
    if not buckets:
        return buckets
    device_type = buckets[0].params[0].device.type
    if not usable(opt, device_type):
        return buckets
    from optim.engine import dispatch

    return dispatch.run(opt, buckets, skip, device_type, gscale, whole)


def kept_device(opt) -> str | None:
    """The device type of the launches kept from the last step (optim/engine/steady.py), or
    None where none are kept."""
    program = getattr(opt.__dict__.get("engine_state"), "program", None)
    return None if program is None else program.launches[0].plan.table.device.type


def run_kept(opt, skip: torch.Tensor | None, gscale: torch.Tensor | None) -> bool:
    """Run the step from the launches kept from the last one (optim/engine/steady.py) if
    nothing they depend on has changed; whether it did (else the full step runs). Asked by
    optim/routes.py's ``run_kept``, after the setting's question (``setting_refusal``)."""
    if getattr(opt.__dict__.get("engine_state"), "program", None) is None:
        return False
    from optim.engine import dispatch

    return dispatch.run_kept(opt, skip, gscale)


def setting_refusal(opt, device_type: str) -> str | None:
    """Why the engine takes no bucket of ``opt`` on ``device_type`` (the setting does not ask
    for it, or it cannot run: Triton missing, turned off, overridden methods), or None."""
    if not wanted(opt.implementation, device_type):
        return f"implementation={opt.implementation} on {device_type}"
    if not usable(opt, device_type):
        from optim.engine.state import of as state_of

        return state_of(opt).off or unavailable_reason(device_type) or "overridden methods"
    return None


def refusal(opt, b, device_type: str) -> str | None:
    """Why the engine does not take bucket ``b`` (optim/bucket.py ``Bucket``) this step, or None
    where it does (wholly, or SOAP's unrotated part): optim/routes.py's first question."""
    why = setting_refusal(opt, device_type)
    if why is not None:
        return why
    from optim.engine import dispatch

    return dispatch.refusal(opt, b)


def covers(opt, p: torch.Tensor, view: dict) -> bool:
    """Whether the engine would step parameter ``p`` under ``view`` (its group as the core's
    routing reads it): ``device_skip_cost`` asks, without building a bucket."""
    if not usable(opt, p.device.type):
        return False
    from optim.engine import dispatch

    return dispatch.covers_param(opt, p, view)
