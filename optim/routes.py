"""One route decision per bucket: which path steps it, and why (docs/optim-engine.md, "Routes").

A bucket of the core (optim/core.py: the tensors of one param group that share a rule) is
stepped by one of four routes, tried in this order, as the optimizer's ``implementation`` asks
(optim/implementation.py: auto, loop, foreach, compiled, triton):

- ``engine``: the Triton engine (optim/engine/), where the setting asks for it on the device
  (``triton``; ``auto`` on CUDA), Triton is there, and the engine covers the rule and the tensors;
- ``compiled``: the ``torch.compile``d step (optim/compiled.py; ``compiled``, and ``auto`` or
  ``triton`` on CUDA);
- ``foreach`` or ``loop``: the eager paths (``foreach``, ``loop``; else the class's default).

``decide`` is the one place that chooses (the one predicate of each route: the engine's is
optim/engine/'s ``refusal``, the compiled step's is here); it returns the route with the reason
the earlier routes were not taken, and the core steps each bucket by it. A step that runs the
launches kept from the last one (optim/engine/steady.py, ``run_kept``) asks ``decide``'s first
question before it does. What happens during the step after all (a kernel that fails to
compile, a global clip whose buckets cannot all take the engine) hands the bucket to ``decide``
again without the engine; a compiled step that fails to compile runs its code eagerly (the
``loop`` route, its reason saying so). Every route is recorded (``record``): ``opt.last_routes``
holds every bucket's route of the last step and ``opt.route_counts`` counts them over all steps.
``taken(opt)`` sums the last step's per route (buckets and reasons): what a run writes to
meta.jsonl and summary.json and logs once at start-up (``lines``; trainer/run.py); a later
change of routes is logged here (``log_changes``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from optim import compiled as compiled_route
from optim import engine as engine_path
from optim.bucket import clip_scope
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
    not to be tried (it handed the bucket back, or does not cover it), or None to ask it."""
    device = b.params[0].device.type
    not_engine = engine or engine_path.refusal(opt, b, device)
    if not_engine is None:
        return Route("engine", f"Triton engine on {device}")
    not_compiled = _not_compiled(opt, b)
    if not_compiled is None:
        return Route("compiled", f"not the engine: {not_engine}")
    eager = "foreach" if foreach else "loop"
    return Route(eager, f"not the engine: {not_engine}; not compiled: {not_compiled}")


def run_kept(opt, skip, gscale) -> bool:
    """Run the step by the launches kept from the last one (optim/engine/steady.py), where that
    step went wholly to the engine and ``decide``'s first question, whether this setting takes
    the engine on the device, has the same answer; the last step's routes recorded again.
    Whether it ran (else the full step runs)."""
    device = engine_path.kept_device(opt)
    if device is None or engine_path.setting_refusal(opt, device) is not None:
        return False
    if not engine_path.run_kept(opt, skip, gscale):
        return False
    record(opt, opt.last_routes)
    return True


def run_fast(opt, buckets: list, foreach: bool, skip, gscale) -> list:
    """Each bucket's route by ``decide``, recorded (``record``); the engine's and the compiled
    buckets stepped; the eager ones returned (their gradients clipped as torch clips where the
    trainer's clip was folded, ``gscale``)."""
    decided = {id(b): decide(opt, b, foreach) for b in buckets}
    taken = [b for b in buckets if decided[id(b)].name == "engine"]
    whole = len(taken) == len(buckets)  # (only a step wholly on the engine is kept)
    handed = engine_path.run(opt, taken, skip, gscale, whole=whole)  # what it handed back
    back = {id(h): "handed back by the engine" for h in handed}
    for h in handed:  # (a whole bucket, or SOAP's rotated rest of one)
        decided[id(h)] = decide(opt, h, foreach, engine=back[id(h)])
    rest = [b for b in buckets if decided[id(b)].name != "engine"] + handed
    ran = [b for b in taken if id(b) not in back]
    apply_clip([g for b in rest for g in b.gs], gscale)  # the others: as torch clips
    eager = []
    for b in rest:
        if decided[id(b)].name == "compiled" and opt._compiled_off:  # given up in this step
            decided[id(b)] = decide(opt, b, foreach, engine=back.get(id(b)))
        if decided[id(b)].name != "compiled":
            eager.append(b)
        elif error := opt._run_compiled(b, skip):  # its code ran eagerly
            decided[id(b)] = Route("loop", f"the compiled step's code run eagerly: {error}")
    record(opt, [(label(b), decided[id(b)]) for b in ran + rest])
    return eager


def _not_compiled(opt, b) -> str | None:
    """Why the compiled step does not take bucket ``b``, or None where it does (``decide``)."""
    if not opt._want_compiled(b):
        device = b.params[0].device.type
        return opt._compiled_off or f"implementation={opt.implementation} on {device}"
    if not compiled_route.covers(b.view):
        return f"rule {b.view['momentum_form']}/{b.view['preconditioner']} is not compiled"
    if clip_scope(b) == "tensor" and any(s is not None for s in b.shards):
        return "a sharded tensor's clip needs the whole tensor's norm"
    if not compiled_route.same_device_and_dtype(b.params):
        return "tensors of several devices or dtypes"
    return None


def record(opt, routes: list[tuple[str, Route]]) -> None:
    """A step's routes: ``opt.last_routes``, counted in ``opt.route_counts``, logged when they
    change (``log_changes``)."""
    opt.last_routes = routes
    opt.route_counts.update(r.name for _, r in routes)
    log_changes(opt, routes)


def label(b) -> str:
    """A bucket as a log line names it: its group's name, its rule (``+mars``: with the MARS
    correction), its number of tensors."""
    view = b.view
    name = view.get("name") or view.get("kind") or "group"
    mars = "+mars" if view.get("variance_reduction") else ""
    return f"{name} {view['momentum_form']}/{view['preconditioner']}{mars} x{len(b.params)}"


def log_changes(opt, routes: list[tuple[str, Route]]) -> None:
    """Log the routes of a step when they change (the first step's at DEBUG: a run logs those
    once at start-up, ``lines``), one line per route."""
    summary = [(name, r.name, r.reason) for name, r in routes]
    before = opt.__dict__.get("_logged_routes")
    if summary == before:
        return
    opt._logged_routes = summary
    level = logging.DEBUG if before is None else logging.INFO
    for line in lines(count(routes)):
        log.log(level, "optimizer routes changed: %s" if before else "%s", line)


def count(routes: list[tuple[str, Route]]) -> dict:
    """Per route, how many buckets took it and why (each reason once, in order)."""
    out: dict = {}
    for _name, route in routes:
        entry = out.setdefault(route.name, {"buckets": 0, "reasons": []})
        entry["buckets"] += 1
        if route.reason not in entry["reasons"]:
            entry["reasons"].append(route.reason)
    return out


def taken(opt) -> dict:
    """The routes of the optimizer's last step, for a run's files: per route, how many buckets
    took it and why (``count``; Schedule-Free AdamW records one route per group). An optimizer
    without routes (torch's AdamW, say) steps its groups itself: its one entry names it and how
    torch was asked to step."""
    if not hasattr(opt, "last_routes"):
        how = [f"{k}={opt.defaults[k]}" for k in ("fused", "foreach") if k in opt.defaults]
        reason = f"{type(opt).__module__}.{type(opt).__name__} ({', '.join(how) or 'defaults'})"
        return {"torch": {"buckets": len(opt.param_groups), "reasons": [reason]}}
    return count(opt.last_routes or [])


def lines(routes: dict) -> list[str]:
    """One log line per route of ``taken``: ``optimizer route foreach: 2 buckets (why)``."""
    out = []
    for name, entry in routes.items():
        n = entry["buckets"]
        why = "; ".join(entry["reasons"])
        out.append(f"optimizer route {name}: {n} bucket{'s' if n != 1 else ''} ({why})")
    return out
