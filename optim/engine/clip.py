"""The trainer's global gradient clip folded into the engine: one norm pass, no scaling pass.

``torch.nn.utils.clip_grad_norm_(params, max_norm)`` reads every gradient for the norm, then
multiplies every gradient by ``coef = min(1, max_norm / (norm + 1e-6))`` in place: a read and a
write of all of them, and about ten launches, before the optimizer reads them once more. Where
the optimizer's step runs on the engine for every parameter that has a gradient, the trainer
asks it instead (``fold_grad_clip``):

1. ``norm_kernel`` (``REDUCE=False``) over every gradient: a partial sum of ``g*g`` per block,
   through a pointer table cached as the step's are (optim/engine/tables.py);
2. ``finish_clip_kernel``: the norm and ``coef`` exactly as torch computes them from it
   (``(1 / (norm + 1e-6)) * max_norm``, clamped to 1, a NaN kept), on the device;
3. the next ``step()`` passes ``coef`` to every kernel that reads a gradient (the MARS norm
   pass, the update pass, the Newton-Schulz pre-pass, Schedule-Free's), which multiplies
   ``g`` by it on load: the same product torch's in-place scaling stores, so MARS's ``g_ref``
   copy is the clipped gradient, as before. Exact mode's reference pass is folded too: the
   stored reference is ``g * coef`` (``store_reference_grad``).

The gradients themselves stay unscaled. ``fold_grad_clip`` returns the norm (a 0-d device tensor,
what ``clip_grad_norm_`` returns: the trainer logs it and the non-finite check reads it) or None
where it cannot fold (the trainer then calls ``clip_grad_norm_``): a parameter with a gradient
the optimizer does not step, or one the engine does not take (a rule it does not cover,
Newton-Schulz's matrices under FSDP2, a dtype other than float32/float64, the engine off),
gradients of several dtypes or devices, FSDP2 shards mixed with plain tensors. Under FSDP2 the
norm pass runs over the local blocks and their sum of squares is all-reduced over the shards'
group (``_finish_sharded``): the norm returned is the whole model's. A bucket the engine hands back during the step after all (a kernel that failed to
compile) gets ``coef`` applied as torch would, ``torch._foreach_mul_``, before the other paths
step it; ``zero_grad`` drops a fold no step took (a step skipped on the host).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
import torch.distributed as dist

from optim import sharded
from optim.engine import layout as L
from optim.engine.availability import wanted as engine_wanted
from optim.engine.state import of as state_of
from optim.engine.tables import Plan, key
from optim.sharded import local

log = logging.getLogger("optim.engine")
EPS = 1e-6  # torch's clip_grad_norm_: max_norm / (total_norm + 1e-6)


class ClipFoldMixin:
    """``can_fold_clip`` / ``fold_grad_clip`` (module docstring) for an optimizer whose steps
    may run on the engine; the class says which parameters the engine takes
    (``_engine_takes``) and passes ``_take_clip_fold()`` to its step's kernels."""

    _clip_fold: torch.Tensor | None = None  # the factor of a fold the next step applies
    clip_fold_off_reason: str | None = None  # why the last fold_grad_clip did not fold

    def _engine_takes(self, p: torch.Tensor, group: dict) -> bool:
        raise NotImplementedError

    def can_fold_clip(self, params: Iterable[torch.Tensor] | None = None) -> bool:
        """Whether ``fold_grad_clip`` would fold the clip over ``params``' gradients (default:
        the optimizer's own parameters) into the engine's step."""
        return self._clip_fold_refusal(self._clip_params(params)) is None

    @torch.no_grad()
    def fold_grad_clip(self, max_norm: float, params: Iterable[torch.Tensor] | None = None):
        """The global norm of ``params``' gradients (a 0-d device tensor, as
        ``clip_grad_norm_`` returns it), the clip to ``max_norm`` left for the next ``step()``
        (or ``store_reference_grad()``) to apply; None where it cannot fold (module docstring),
        the gradients then as they were, for ``clip_grad_norm_``."""
        params = self._clip_params(params)
        engine = state_of(self)
        engine.sums_pending = None
        ident = (tuple(id(p) for p in params), self.implementation, engine.off,
                 len(self.param_groups),
                 tuple(-1 if p.grad is None else local(p.grad).data_ptr() for p in params),
                 self._merge_key(params))  # fmt: skip
        kept = engine.fold
        if kept is not None and kept[0] == ident:  # the same gradients: no check, no plan key
            plan, group, index = kept[1:]
            norm, self._clip_fold, engine.sums_pending = _launch(
                plan, float(max_norm), group=group, index=index
            )
            return norm
        reason = self._clip_fold_refusal(params)
        if reason is None:
            with_grads = [p for p in params if p.grad is not None]
            grads = [local(p.grad) for p in with_grads]
            refs = self._merge_refs(with_grads)
            plan = _fold(self, grads, refs)
            if plan is None:
                reason = engine.off
            else:
                shards = [p for p in with_grads if sharded.is_sharded(p)]
                group = sharded.group_of(shards) if shards else None  # FSDP2: all-reduced
                index = None if refs is None else {  # a merged row by its state dict
                    id(self.state[p]): r for r, (p, ref) in enumerate(zip(with_grads, refs))
                    if ref is not None}  # fmt: skip
                engine.fold, engine.fold_params = (ident, plan, group, index), params
                norm, self._clip_fold, engine.sums_pending = _launch(
                    plan, float(max_norm), group=group, index=index
                )
        if reason != self.__dict__.get("clip_fold_off_reason", "") and (
            reason is None or (params and engine_wanted(self.implementation, params[0].device.type))
        ):  # said once, where the engine was asked for
            log.info("global gradient clip: %s", "folded into the optimizer engine's norm pass"
                     if reason is None else f"clip_grad_norm_ ({reason})")  # fmt: skip
        self.clip_fold_off_reason = reason
        return norm if reason is None else None

    def _take_clip_fold(self) -> torch.Tensor | None:
        """The pending fold's factor, once (the step or the reference store that applies it);
        its sums merged with MARS's norm pass become the step's (``engine_state.sums``)."""
        coef, self._clip_fold = self._clip_fold, None
        engine = state_of(self)
        engine.sums, engine.sums_pending = engine.sums_pending, None
        return coef

    def zero_grad(self, set_to_none: bool = True) -> None:
        """torch's; a fold no step applied (the step was skipped on the host) is dropped."""
        self._clip_fold = None
        state_of(self).sums_pending = None  # (``sums``: the last step's, read with its factor)
        super().zero_grad(set_to_none=set_to_none)

    def _merge_refs(self, params: list[torch.Tensor]) -> list | None:
        """Per parameter (each with a gradient), the reference gradient whose MARS correction
        the step clips (``clip`` tensor or global, approx mode: the local block of
        ``last_grad``), or None for one without; None for all where the fold's pass is not
        merged with MARS's norm pass: exact mode (its fold is also the reference store's, whose
        gradients no correction reads), no rule view (Schedule-Free), no such tensor (Newton-
        Schulz's pre-pass keeps its own norm pass: optim/engine/launch.py ``_merged``), or a
        state not made yet (the first step)."""
        from optim.preconditioners import PRECONDITIONERS, NewtonSchulz

        view_of = getattr(self, "rule_view", None)
        if view_of is None or not getattr(self, "is_approx", True):
            return None
        group_of = {id(p): g for g in self.param_groups for p in g["params"]}
        refs = []
        for p in params:
            view = view_of(p, group_of[id(p)])[1]
            ns = issubclass(PRECONDITIONERS[view["preconditioner"]], NewtonSchulz)
            if (not view.get("variance_reduction") or ns  # (NS's pre-pass: its own norm pass)
                    or view.get("clip") not in ("tensor", "global")):  # fmt: skip
                refs.append(None)
                continue
            ref = self.state.get(p, {}).get("last_grad")
            if ref is None:
                return None
            refs.append(local(ref))
        return refs if any(r is not None for r in refs) else None

    def _prepare_merge(self) -> None:
        """After a step that made the reference buffers under an unmerged fold (the first): the
        merged fold's plan built and compiled now, so that the next fold (its gradients where
        they were) finds it in the cache, as a steady step's plans are."""
        engine = state_of(self)
        params = engine.fold_params
        if params is None or engine.off:
            return
        with_grads = [p for p in params if p.grad is not None]
        refs = self._merge_refs(with_grads) if with_grads else None
        if refs is not None:
            _fold(self, [local(p.grad) for p in with_grads], refs)

    def _merge_key(self, params: list[torch.Tensor]) -> tuple:
        """What the kept fold's merge depends on beyond the gradients: the reference buffers'
        addresses (their state made or loaded) and the groups' clip scopes."""
        if getattr(self, "rule_view", None) is None or not getattr(self, "is_approx", True):
            return ()
        state = self.state
        refs = tuple(-1 if "last_grad" not in state.get(p, ()) else
                     local(state[p]["last_grad"]).data_ptr() for p in params)  # fmt: skip
        return refs, tuple(g.get("clip") for g in self.param_groups)

    def _clip_params(self, params) -> list[torch.Tensor]:
        if params is None:
            return [p for g in self.param_groups for p in g["params"]]
        return list(params)

    def _clip_fold_refusal(self, params: list[torch.Tensor]) -> str | None:
        """Why the clip over ``params`` cannot fold, or None; the coverage part is cached per
        set of parameters with gradients (it builds a rule per parameter)."""
        from optim.engine.rules import tensors_fit  # (the rules import the preconditioners)

        with_grads = [p for p in params if p.grad is not None]
        grads = [local(p.grad) for p in with_grads]  # FSDP2: the local blocks
        if not grads:
            return "no gradients"
        shards = {sharded.is_sharded(p) for p in with_grads}
        if len(shards) > 1:
            return "FSDP2 shards and plain tensors among the gradients"
        if not shards.pop() and not any(g.numel() for g in grads):
            return "no gradients"
        if not tensors_fit(grads):
            return "gradients of several dtypes or devices, or not float32/float64 contiguous"
        ident = (tuple(id(p) for p in params if p.grad is not None), self.implementation,
                 state_of(self).off)  # fmt: skip
        cached = state_of(self).fold_checked
        if cached is None or cached[0] != ident:
            cached = state_of(self).fold_checked = (ident, self._clip_coverage(params))
        return cached[1]

    def _clip_coverage(self, params: list[torch.Tensor]) -> str | None:
        group_of = {id(p): g for g in self.param_groups for p in g["params"]}
        measured = {id(p) for p in params if p.grad is not None}
        if not measured <= group_of.keys():
            return "a parameter with a gradient is not this optimizer's"
        stepped = {id(p) for g in self.param_groups for p in g["params"] if p.grad is not None}
        if stepped != measured:
            return "the optimizer steps gradients the clip does not measure"
        for p in params:
            if p.grad is not None and not self._engine_takes(p, group_of[id(p)]):
                return f"a parameter of shape {tuple(p.shape)} does not take the engine"
        return None


def apply_to(grads: list[torch.Tensor], coef: torch.Tensor | None) -> None:
    """A fold's factor applied as torch's clip applies it (for gradients the engine left)."""
    if coef is not None and grads:
        torch._foreach_mul_(grads, coef)


class Sums:
    """A merged fold's sums for the step's MARS clips (optim/engine/launch.py ``_merged``):
    ``partial`` holds ``sum(g*g)``, ``sum(g*g_ref)``, ``sum(g_ref*g_ref)`` at ``0``,
    ``stride``, ``2 * stride``, per block of ``table``'s rows, or per row where ``summed``
    (FSDP2: all-reduced); ``index`` maps a merged row's state dict (its ``id``) to its row;
    ``coef`` is the clip's factor."""

    def __init__(self, plan: Plan, partial: torch.Tensor, stride: int, summed: bool,
                 index: dict, coef: torch.Tensor) -> None:  # fmt: skip
        self.table, self.partial, self.stride, self.summed = plan.table, partial, stride, summed
        self.index, self.coef = index, coef


def _fold(opt, grads: list[torch.Tensor], refs: list | None = None):
    """The fold's plan over ``grads``, its kernels compiled; None where a kernel failed to
    compile (the engine is then off for ``opt``: its ``engine_state.off``). ``refs`` (one per
    gradient, None for a row without): the pass merged with MARS's norm pass, three partial
    sums a block (``fold_norm_kernel``)."""
    from optim.engine.launch import BLOCKS

    device, dtype = grads[0].device, grads[0].dtype
    block = BLOCKS[device.type]
    engine = state_of(opt)
    cache = engine.cache
    cols = {L.C_G: grads} if refs is None else {L.C_G: grads, L.C_REF: refs}
    plan = cache.get(key(cols, block, ("clip", refs is not None)),
                     lambda: _fold_plan(cols, block, refs is not None))  # fmt: skip
    compiled = engine.compiled
    variant = ("clip", dtype, plan.aligned, refs is not None)
    if variant not in compiled:
        try:
            _launch(plan, 1.0, dry=True, index={} if refs is not None else None)
        except Exception as e:  # noqa: BLE001 (a compile failure: nothing written, fall back)
            engine.off = f"a kernel failed to compile ({type(e).__name__}: {e})"
            log.warning("optimizer engine off (%s); using the other paths", engine.off)
            return None
        compiled.add(variant)
    return plan


def _fold_plan(cols: dict, block: int, merged: bool) -> Plan:
    """The fold's plan; merged: three partial sums a block (``fold_norm_kernel``)."""
    plan = Plan(cols, block, norm=True)
    if merged:
        plan.partial = torch.empty(3 * max(plan.nblocks, 1), dtype=plan.partial.dtype,
                                   device=plan.partial.device)  # fmt: skip
        plan.which = plan.blocks[:, 0].long()  # each program's row (FSDP2's per-row sums)
    return plan


def _launch(plan: Plan, max_norm: float, dry: bool = False, group=None, index=None):
    """``(norm, coef, sums)``: two launches over the plan's gradients (``dry``: compile only);
    ``index`` (the merged rows, ``Sums``; None: not merged) the norm pass merged with MARS's,
    ``sums`` then the step's ``Sums`` (else None). FSDP2 (``group``: the shards' process group):
    the norm pass over the local blocks, then ``_finish_sharded``."""
    from optim.engine.availability import kernels_for
    from optim.engine.launch import CHUNK
    from optim.engine.loader import Go, tl_dtype, warps

    device, dtype = plan.partial.device, plan.partial.dtype
    k, chunk, block, go = kernels_for(device.type), CHUNK[device.type], plan.block, Go(dry=dry)
    out = torch.empty(2, dtype=dtype, device=device)  # new each step: a kept norm stays valid
    merged, nb = index is not None, plan.nblocks
    if nb and merged:  # (FSDP2: a rank may hold no element of any gradient)
        go(k.fold_norm_kernel, (nb,), plan.table, plan.blocks, plan.partial, nb,
           DT=tl_dtype(dtype), ACC=tl_dtype(dtype), BLOCK=block, ALIGNED=plan.aligned,
           num_warps=warps(block))  # fmt: skip
    elif nb:
        go(k.norm_kernel, (nb,), plan.table, plan.blocks, plan.partial, 0.0,
           plan.partial, DT=tl_dtype(dtype), ACC=tl_dtype(dtype), BLOCK=block,
           ALIGNED=plan.aligned, REDUCE=False, GSCALE=False, num_warps=warps(block))  # fmt: skip
    if dry:
        if group is None:
            go(k.finish_clip_kernel, (1,), plan.partial, nb, out, max_norm, EPS, CHUNK=chunk)
        return None
    if group is not None:
        return _finish_sharded(plan, max_norm, group, index)
    go(k.finish_clip_kernel, (1,), plan.partial, nb, out, max_norm, EPS, CHUNK=chunk)
    sums = None if index is None else Sums(plan, plan.partial, nb, False, index, out[1:])
    return out[0], out[1], sums


def _finish_sharded(plan: Plan, max_norm: float, group, index=None):
    """``finish_clip_kernel``'s norm and factor where the gradients are FSDP2 shards: the
    local blocks' sum of squares all-reduced over ``group`` (one small all-reduce, no host
    read), then the norm and ``min(1, max_norm / (norm + eps))`` as torch computes them.
    Merged (``index``): the three sums per row all-reduced instead, in the same one call (the
    step's MARS clips then need none), the norm from the rows' ``sum(g*g)``."""
    if index is None:
        total = plan.partial[: plan.nblocks].sum().reshape(1)
        dist.all_reduce(total, group=group)
    else:
        nb, n = plan.nblocks, plan.n
        which = getattr(plan, "which", None)
        if which is None:  # each program's row, kept on the plan (a device copy, once)
            which = plan.which = plan.blocks[:, 0].long()
        flat = torch.zeros(3 * n, dtype=plan.partial.dtype, device=plan.partial.device)
        for i in range(3):
            flat[i * n : (i + 1) * n].index_add_(0, which, plan.partial[i * nb : i * nb + nb])
        dist.all_reduce(flat, group=group)
        total = flat[:n].sum().reshape(1)
    norm = total.sqrt()
    coef = (norm + EPS).reciprocal() * max_norm  # torch's ``max_norm / x``: reciprocal, times
    coef = torch.where(coef > 1.0, torch.ones_like(coef), coef)  # a NaN kept, as torch's clamp
    sums = None if index is None else Sums(plan, flat, n, True, index, coef)
    return norm[0], coef[0], sums
