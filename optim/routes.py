"""One route decision per bucket: which path steps it, and why (docs/optim-engine.md, "Routes").

A bucket of the core (optim/core.py: the tensors of one param group that share a rule) is
stepped by one of four routes, tried in this order:

- ``engine``: the Triton engine (optim/engine/), where the ``fused`` switch asks for it on the
  device, Triton is there, and the engine covers the rule and the tensors;
- ``compiled``: the ``torch.compile``d step (optim/fused.py);
- ``foreach`` or ``loop``: the eager paths (the ``foreach`` switch).

``decide`` is the one place that chooses; it returns the route with the reason the earlier
routes were not taken, and the core steps each bucket by it. What happens during the step
after all (a kernel that fails to compile, a global clip whose buckets cannot all take the
engine) hands the bucket to ``decide`` again without the engine, and that is recorded too:
``opt.last_routes`` holds every bucket's route of the last step, and a change of routes is
logged once (``log_changes``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from optim import engine as engine_path
from optim import fused as fused_path
from optim.engine.clip import apply_to as apply_clip

log = logging.getLogger("optim.routes")
ROUTES = ("engine", "compiled", "foreach", "loop")


@dataclass(frozen=True)
class Route:
    """A bucket's route (one of ``ROUTES``) and why."""

    name: str
    reason: str


def decide(opt, b, foreach: bool, *, engine: str | None = None) -> Route:
    """The route of bucket ``b`` this step (module docstring). ``engine``: why the engine is
    not to be tried (it handed the bucket back), or None to ask it."""
    device = b.params[0].device.type
    not_engine = engine or engine_path.refusal(opt, b, device)
    if not_engine is None:
        return Route("engine", f"Triton engine on {device}")
    not_compiled = compiled_refusal(opt, b)
    if not_compiled is None:
        return Route("compiled", f"not the engine: {not_engine}")
    eager = "foreach" if foreach else "loop"
    return Route(eager, f"not the engine: {not_engine}; not compiled: {not_compiled}")


def run_fast(opt, buckets: list, foreach: bool, skip, gscale) -> list:
    """Each bucket's route by ``decide``, recorded in ``opt.last_routes``; the engine's and the
    compiled buckets stepped; the eager ones returned (their gradients clipped as torch clips
    where the trainer's clip was folded, ``gscale``)."""
    decided = {id(b): decide(opt, b, foreach) for b in buckets}
    taken = [b for b in buckets if decided[id(b)].name == "engine"]
    whole = len(taken) == len(buckets)  # (only a step wholly on the engine is kept)
    handed = engine_path.run(opt, taken, skip, gscale, whole=whole)  # what it handed back
    back = {id(h) for h in handed}
    for h in handed:  # (a whole bucket, or SOAP's rotated rest of one)
        decided[id(h)] = decide(opt, h, foreach, engine="handed back by the engine")
    rest = [b for b in buckets if decided[id(b)].name != "engine"] + handed
    ran = [b for b in taken if id(b) not in back]
    apply_clip([g for b in rest for g in b.gs], gscale)  # the others: as torch clips
    eager = [b for b in rest
             if decided[id(b)].name != "compiled" or not opt._try_fused(b, skip)]  # fmt: skip
    opt.last_routes = [(label(b), decided[id(b)]) for b in ran + rest]
    log_changes(opt, opt.last_routes)
    return eager


def compiled_refusal(opt, b) -> str | None:
    """Why the compiled step does not take bucket ``b``, or None where it does."""
    if not opt._want_fused(b):
        return opt._fused_off or f"fused={opt.fused!r} on {b.params[0].device.type}"
    if not fused_path.fusable(b.view):
        return f"rule {b.view['momentum_form']}/{b.view['preconditioner']} is not compiled"
    clip = b.view.get("clip") if b.view.get("variance_reduction") else None
    if clip == "tensor" and any(s is not None for s in b.shards):
        return "a sharded tensor's clip needs the whole tensor's norm"
    if not fused_path.same_device_and_dtype(b.params):
        return "tensors of several devices or dtypes"
    return None


def label(b) -> str:
    """A bucket as a log line names it: its group's name, its rule (``+mars``: with the MARS
    correction), its number of tensors."""
    view = b.view
    name = view.get("name") or view.get("kind") or "group"
    mars = "+mars" if view.get("variance_reduction") else ""
    return f"{name} {view['momentum_form']}/{view['preconditioner']}{mars} x{len(b.params)}"


def log_changes(opt, routes: list[tuple[str, Route]]) -> None:
    """Log the routes of a step once, and again whenever they change."""
    summary = [(name, r.name, r.reason) for name, r in routes]
    if summary == opt.__dict__.get("_logged_routes"):
        return
    opt._logged_routes = summary
    for name, route, reason in summary:
        log.info("optimizer route: %s -> %s (%s)", name, route, reason)


def taken(opt) -> dict:
    """The routes of the optimizer's last step, for a run's summary: per route, how many
    buckets took it and why. An optimizer outside the core (torch's AdamW, say) steps its
    groups itself: its one entry names it and how torch was asked to step."""
    if not hasattr(opt, "last_routes"):
        how = [f"{k}={opt.defaults[k]}" for k in ("fused", "foreach") if k in opt.defaults]
        reason = f"{type(opt).__module__}.{type(opt).__name__} ({', '.join(how) or 'defaults'})"
        return {"torch": {"buckets": len(opt.param_groups), "reasons": [reason]}}
    out: dict = {}
    for _name, route in getattr(opt, "last_routes", None) or []:
        entry = out.setdefault(route.name, {"buckets": 0, "reasons": []})
        entry["buckets"] += 1
        if route.reason not in entry["reasons"]:
            entry["reasons"].append(route.reason)
    return out
