"""Schedule-Free AdamW (optim/schedulefree.py) on the engine: one ``schedulefree_kernel`` launch
per param group and step, over a pointer table built once (y, g, z, v); the gradient read times
the folded global clip's factor where the trainer folded it (optim/engine/clip.py)."""

from __future__ import annotations

import logging

import torch

from optim.engine import layout as L
from optim.engine.availability import kernels_for, usable
from optim.engine.launch import BLOCKS
from optim.engine.loader import Go, tl_dtype, warps
from optim.engine.rules import tensors_fit
from optim.engine.state import of as state_of
from optim.engine.tables import Plan, key

log = logging.getLogger("optim.engine")


def step(opt, ps: list, grads: list, zs: list, vs: list, *, beta1: float, beta2: float,
         bc2: float, eps: float, decay: float, ckp1: float, lr: float,
         gscale: torch.Tensor | None = None) -> bool:  # fmt: skip
    """One group's step (the foreach path's arithmetic) on the engine; False where it does not
    run (off, not asked for on this device, or tensors it does not take)."""
    device_type = ps[0].device.type
    if not usable(opt, device_type) or not tensors_fit(ps + grads + zs + vs):
        return False
    k, block = kernels_for(device_type), BLOCKS[device_type]
    cache = state_of(opt).cache
    cols = {L.C_P: ps, L.C_G: grads, L.C_M: zs, L.C_V: vs}
    plan = cache.get(key(cols, block, ("schedulefree",)), lambda: Plan(cols, block))
    args = (plan.table, plan.blocks, plan.table if gscale is None else gscale, beta2, 1 - beta2,
            bc2, eps, decay, ckp1, lr * (beta1 * (1 - ckp1) - 1), lr)  # fmt: skip
    kw = dict(DT=tl_dtype(ps[0].dtype), BLOCK=block, DECAY=decay != 0, ALIGNED=plan.aligned,
              GSCALE=gscale is not None, num_warps=warps(block))  # fmt: skip
    ok = opt.__dict__.setdefault("_engine_ok", set())
    variant = (ps[0].dtype, decay != 0, plan.aligned, gscale is not None)
    if variant not in ok:
        try:  # compiled before anything is written: a failure leaves the tensors as they were
            Go(dry=True)(k.schedulefree_kernel, (plan.nblocks,), *args, **kw)
        except Exception as e:  # noqa: BLE001 (any compile failure: foreach takes over)
            state_of(opt).off = f"a kernel failed to compile ({type(e).__name__}: {e})"
            log.warning("optimizer engine off (%s); using foreach", state_of(opt).off)
            return False
        ok.add(variant)
    if plan.nblocks:
        Go(dry=False)(k.schedulefree_kernel, (plan.nblocks,), *args, **kw)
    return True
