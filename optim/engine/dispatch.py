"""Which of a step's buckets the engine takes, the first run of a new set of kernels (compiled
before anything is written, so a compile failure falls back cleanly), and the bookkeeping the
core expects of a fast path (exact mode's reference swap; optim/routes.py records the route)."""

from __future__ import annotations

import dataclasses
import logging
from types import SimpleNamespace

import torch

from optim import sharded
from optim.engine import launch, rules, steady
from optim.engine import layout as L
from optim.engine.availability import kernels_for
from optim.engine.state import of as state_of
from optim.functional import mars_correct

log = logging.getLogger("optim.engine")


def subset(b, idx: list[int]):
    """The bucket ``b`` (optim/bucket.py ``Bucket``) restricted to the tensors ``idx``."""

    def pick(xs):
        return [xs[i] for i in idx]

    return dataclasses.replace(b, params=pick(b.params), states=pick(b.states), gs=pick(b.gs),
                               cs=[], shards=pick(b.shards), owners=pick(b.owners))  # fmt: skip


def refusal(opt, b) -> str | None:
    """Why the engine does not take bucket ``b``'s rule and tensors, or None (``split``)."""
    return _split(opt, b)[0]


def _split(opt, b) -> tuple[str | None, tuple | None, list[int]]:
    """``(why not, (part, kind), indices taken)``: the engine's one look at bucket ``b``."""
    kind = rules.kind_of(b, is_approx=opt.is_approx, correction=opt.correction)
    view = b.view
    if kind is None:
        custom = " with a subclass's correction" if opt.correction is not mars_correct else ""
        return (
            f"rule {view['momentum_form']}/{view['preconditioner']}{custom} not covered",
            None,
            [],
        )
    if not rules.shards_fit([s is not None for s in b.shards]):
        return "FSDP2 shards and plain tensors in one bucket", None, []
    idx = [i for i in range(len(b.params)) if rules.takes(b, i)]
    if not idx:
        return "SOAP's rotated matrices", None, []
    part = b if len(idx) == len(b.params) else subset(b, idx)
    if not rules.tensors_fit([t for ts in launch.columns(part, kind).values() for t in ts]):
        return "tensors not float32/float64, contiguous, on one device", None, []
    return None, (part, kind), idx


def split(opt, b) -> tuple[tuple | None, object | None]:
    """``((part, kind), rest)``: the part of bucket ``b`` the engine takes and the rest."""
    why, item, idx = _split(opt, b)
    if why is not None:
        return None, b
    others = [i for i in range(len(b.params)) if i not in set(idx)]
    return item, (subset(b, others) if others else None)


def _sharded(b) -> bool:
    return b.shards[0] is not None


def _global(b) -> bool:
    return bool(b.view.get("variance_reduction")) and b.view.get("clip") == "global"


def run(opt, buckets: list, skip: torch.Tensor | None, device_type: str,
        gscale: torch.Tensor | None = None, whole: bool = False) -> list:  # fmt: skip
    """Step what the engine covers (optim/engine/launch.py); return the buckets it left
    (``gscale``: the folded global clip's factor, applied to the gradients it reads;
    ``whole``: ``buckets`` are all of the step's, so its launches may be kept)."""
    items, rest = [], []
    for b in buckets:
        item, left = split(opt, b)
        items += [item] if item else []
        rest += [left] if left is not None else []
    glob = [b for b, kind in items if kind.clip == L.CLIP_GLOBAL]
    # a global clip spans its buckets: all here or none, and all sharded (FSDP2) or none
    if any(_global(b) for b in rest) or len({_sharded(b) for b in glob}) > 1:
        rest += glob
        items = [(b, kind) for b, kind in items if kind.clip != L.CLIP_GLOBAL]
    if not items:
        return rest
    k = kernels_for(device_type)
    engine = state_of(opt)
    cache, compiled = engine.cache, engine.compiled
    sums = engine.sums if gscale is not None else None  # the fold's, merged (clip.py)
    try:
        launches = launch.step(items, skip, k, cache, device_type, compiled, gscale, sums)
    except launch.CompileFailed as e:  # nothing written: the other paths take over
        engine.off = f"a kernel failed to compile ({e})"
        log.warning("optimizer engine off (%s); using the other paths", engine.off)
        return buckets
    for b, _ in items:
        opt._swap_exact(b, skip)
    keep(opt, items, launches, rest or not whole, steady.flags(skip, gscale, sums))
    if gscale is not None and sums is None and hasattr(opt, "_prepare_merge"):
        opt._prepare_merge()  # (the state made: the next fold may merge, its plan ready)
    return rest


def keep(opt, items: list, launches: list, rest, flags: tuple) -> None:
    """Keep the step's launches for the next steps (optim/engine/steady.py) where it ran wholly
    on the engine (``rest``: falsy; FSDP2 shards included: their local blocks' addresses are
    checked) and not in exact mode (whose reference buffers swap every step)."""
    exact = not opt.is_approx and any(b.view.get("variance_reduction") for b, _ in items)
    if rest or exact or not state_of(opt).keep:  # (keep False: a benchmark's "before")
        state_of(opt).program = None
        return
    engine = state_of(opt)
    engine.program = steady.Program(opt, items, launches, opt.rule_view, flags)
    engine.programs_built += 1


def run_kept(opt, skip: torch.Tensor | None, gscale: torch.Tensor | None) -> bool:
    """Run the kept program if it still holds (steady.Program.matches); whether it ran."""
    engine = state_of(opt)
    program = engine.program
    sums = engine.sums if gscale is not None else None  # the fold's, merged (clip.py)
    if program is None or not program.matches(opt, steady.flags(skip, gscale, sums)):
        return False
    program.prepare(opt, gscale, sums)
    device_type = program.launches[0].plan.table.device.type
    cache = engine.cache
    launch.run(program.launches, skip, kernels_for(device_type), cache, device_type)
    return True


def covers_param(opt, p: torch.Tensor, view: dict) -> bool:
    """Whether the engine takes ``p`` in a bucket of rule ``view`` (no state needed)."""
    from optim.momentum import MOMENTA
    from optim.preconditioners import PRECONDITIONERS

    b = SimpleNamespace(view=view, momentum=MOMENTA[view["momentum_form"]], params=[p],
                        preconditioner=PRECONDITIONERS[view["preconditioner"]](view))  # fmt: skip
    kind = rules.kind_of(b, is_approx=opt.is_approx, correction=opt.correction)
    if kind is None or not rules.shards_fit([sharded.is_sharded(p)]):
        return False
    return rules.takes(b, 0) and rules.tensors_fit([sharded.local(p)])
