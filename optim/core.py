"""The one variance-reduction core every optimizer here runs on (MARS, Yuan et al. 2025, Alg. 1).

For each tensor of a param group, with ``kappa = gamma * beta1 / (1 - beta1)``:

    c = g + kappa * (g - g_ref)        if the group has ``variance_reduction`` (else c = g)
    c = c / max(1, ||c||)              clip scope ``tensor`` | ``global`` (over every tensor that
                                       asks for it) | ``none``; first step: g_ref = 0 (``zero``,
                                       official) or c_1 = g_1 (``plain``)
    u = momentum(c)                    optim/momentum.py (EMA, heavy-ball, Lion, one-buffer)
    d = preconditioner.direction(u)    optim/preconditioners.py (Adam, Sign, Newton-Schulz)
    p = p - lr * (wd * p + d)          decoupled weight decay and the step

The group names its momentum form (``momentum_form``) and preconditioner (``preconditioner``):
its typed rule (optim/rule.py), checked when the group is added (known keys only, each value by
its one validator, optim/options.py). The core counts ``state["step"]`` for every tensor, whatever
the momentum, so any preconditioner may read it.
Two routing rules, both of the official code: with ``split_1d`` (MARS, ``optimize_1d=False``)
tensors that are not 2-D take AdamW on the raw gradient with ``betas_1d``, ``weight_decay_1d``
and lr ``lr * lr_1d_factor``; a tensor the preconditioner does not handle (Newton-Schulz: not
2-D) takes Adam with the group's own values. g_ref is a copy of the last gradient (approx) or the
gradient stored by ``store_reference_grad`` (exact; optim/reference.py). No host synchronisation.
"""

from __future__ import annotations

import logging
from collections import Counter

import torch

from optim import compiled as compiled_route
from optim import engine as engine_path
from optim import implementation as implementations
from optim import masked, routes, sharded
from optim.bucket import Bucket, apply_step, clip_scope, probe, route
from optim.engine import state as engine_state
from optim.engine.clip import ClipFoldMixin
from optim.functional import clip_unit_norm_, mars_correct, mars_correction, mars_kappa
from optim.momentum import MOMENTA
from optim.options import check_group_keys, check_option
from optim.preconditioners import PRECONDITIONERS, option_keys
from optim.reference import ReferenceGradMixin
from optim.schedules import check_hyper_schedules

Tensors = list[torch.Tensor]
logger = logging.getLogger(__name__)
# The keys a param group may hold besides every registered preconditioner's options: the
# hyperparameters, the rule (optim/rule.py) and keys of torch / the schedules / our grouping.
GROUP_KEYS = frozenset({
    "params", "lr", "weight_decay", "betas", "momentum", "nesterov",  # hyperparameters
    "variance_reduction", "gamma", "clip", "first_step",  # the MARS correction
    "momentum_form", "preconditioner",  # the rule
    "split_1d", "lr_1d_factor", "betas_1d", "weight_decay_1d",  # MARS's non-2-D routing
    "initial_lr", "kind", "name",  # schedules (torch's key); optim/groups.py; a label
    "schedules",  # per-step values of other keys (gamma, ...): optim/schedules.py
})  # fmt: skip
# Private methods whose work the fast routes (optim/compiled.py, optim/engine/) do themselves: a
# subclass that overrides one would be ignored there, so such a class never takes them.
FAST_REPLACES = ("_corrections", "_advance_references", "_advance_reference")


class VarianceReduced(ClipFoldMixin, ReferenceGradMixin, torch.optim.Optimizer):
    """The core optimizer: the groups say which momentum and preconditioner (module docstring).

    ``implementation`` (optim/implementation.py; optim/routes.py decides each bucket's route by
    it): ``auto`` the Triton engine (optim/engine/) on CUDA where Triton is present, then the
    compiled step (on a CPU the compile time outweighs short runs), then the eager path; on a CPU
    the eager path: foreach, or the per-tensor loop where the class's ``default_foreach`` says so
    (``foreach_for``: a class default of None means foreach on CUDA only). ``loop`` the
    per-tensor loop (the readable reference) and ``foreach`` the torch._foreach path, everywhere
    (both tested equal in float64). ``compiled`` every element-wise bucket (optim/compiled.py) as one
    ``torch.compile``d step on any device; where inductor cannot run (no C++ compiler, no
    Triton) it logs why and takes the eager path. ``triton`` the engine on any device (a CPU
    through Triton's interpreter).

    Extension points (docs/adding-an-optimizer.md): a subclass may set ``correction``, a
    function ``(g, g_ref, kappa) -> c`` of one tensor (element-wise torch ops, no host reads),
    which every path calls: the loop, foreach and the compiled step; and ``adapter_keys``, the
    param-group keys it adds. A group's ``schedules`` key sets other keys per step
    (optim/schedules.py, e.g. a gamma decaying to 0). A subclass that overrides one of the
    private methods the compiled step replaces (``FAST_REPLACES``) is refused
    ``implementation="compiled"`` and ``"triton"``.
    """

    default_foreach: bool | None = True  # None: foreach on CUDA, the per-tensor loop elsewhere
    adapter_keys: tuple[str, ...] = ()  # group keys a subclass adds (a drop-in's official names)
    correction = staticmethod(mars_correct)  # c = g + kappa * (g - g_ref), one tensor

    def __init__(self, groups, defaults: dict | None = None, *, is_approx: bool = True,
                 implementation: str = implementations.DEFAULT) -> None:  # fmt: skip
        implementations.check(implementation, implementations.CORE, who=type(self).__name__)
        overridden = self.private_overrides()
        if implementation in ("compiled", "triton") and overridden:
            raise ValueError(
                f"implementation={implementation!r}: {type(self).__name__} overrides "
                f"{', '.join(overridden)}, which the fast paths do not call; set the class "
                "attribute `correction` instead (docs/adding-an-optimizer.md) or pass "
                "implementation='foreach'"
            )
        super().__init__(groups, defaults or {})
        self.is_approx, self.implementation = is_approx, implementation
        self._reference_pending = False
        self._compiled_ok: set = set()  # bucket signatures that compiled and ran
        self._compiled_off: str | None = None  # why the compiled step was given up, once it was
        self.engine_state = engine_state.EngineState()  # the engine's tables, kept launches
        # The route each bucket of the last step took, with its reason (optim/routes.py), and
        # the routes' counts over all steps: a test of a fast path asserts it ran.
        self.last_routes: list = []
        self.route_counts: Counter = Counter()

    @classmethod
    def private_overrides(cls) -> list[str]:
        """The methods of ``FAST_REPLACES`` this class overrides (then never compiled)."""
        return [n for n in FAST_REPLACES if getattr(cls, n) is not getattr(VarianceReduced, n)]

    @property
    def off_reason(self) -> str | None:
        """Why a fast path is off (the compiled step given up, or the engine where it was asked
        for by name), or None."""
        return self._compiled_off or self.engine_state.off

    def add_param_group(self, param_group: dict) -> None:
        """torch's, then the group's check: known keys only, each value by its one validator."""
        super().add_param_group(param_group)
        group, where = self.param_groups[-1], f"param group {len(self.param_groups) - 1}"
        check_group_keys(group, GROUP_KEYS | option_keys() | set(self.adapter_keys), where)
        for key, value in group.items():
            if key != "params":
                check_option(key, value)
        check_rule(group)
        check_hyper_schedules(group, where)

    def rule_view(self, p: torch.Tensor, group: dict) -> tuple[str, dict]:
        """``route(p, group)``: the rule for ``p`` and its group as that rule reads it (the
        engine's kept launch list asks each step, optim/engine/steady.py)."""
        return route(p, group)

    def _uses_reference(self, p: torch.Tensor, group: dict) -> bool:
        return route(p, group)[1].get("variance_reduction", False)

    def _engine_takes(self, p: torch.Tensor, group: dict) -> bool:
        return engine_path.covers(self, p, route(p, group)[1])

    @classmethod
    def foreach_for(cls, device_type: str) -> bool:
        """Whether the class's default eager path (``implementation`` auto, compiled, triton) is
        foreach on ``device_type``."""
        if cls.default_foreach is None:
            return device_type == "cuda"
        return cls.default_foreach

    def _use_foreach(self) -> bool:
        chosen = implementations.eager_foreach(self.implementation)
        if chosen is not None:
            return chosen
        first = next((p for g in self.param_groups for p in g["params"]), None)
        return self.foreach_for(first.device.type if first is not None else "cpu")

    @torch.no_grad()
    def step(self, closure=None):
        """One step of every group (module docstring); ``closure`` re-evaluates the loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_reference()
        skip = _skip_flag(getattr(self, "found_inf", None))
        gscale = self._take_clip_fold()  # the trainer's clip, folded: optim/engine/clip.py
        if routes.run_kept(self, skip, gscale):  # the last step's launches, kept
            self._reference_pending = False
            return loss
        foreach = self._use_foreach()
        buckets = [b for group in self.param_groups for b in self._buckets(group)]
        self._last_counted = [s for b in buckets for s in b.owners]  # the state dicts
        buckets = routes.run_fast(self, buckets, foreach, skip, gscale)  # the eager ones left
        # the eager paths cannot mask their writes: under a flag they step on copies
        staged = masked.Staged(buckets) if skip is not None and buckets else None
        for b in buckets:
            b.cs = self._corrections(b, foreach) if b.view.get("variance_reduction") else b.gs
        for scope in ("tensor", "global"):  # a global clip spans every group that asks for it
            clipped = [b for b in buckets if clip_scope(b) == scope]
            cs = [c for b in clipped for c in b.cs]
            shards = [s for b in clipped for s in b.shards]
            if any(s is not None for s in shards):  # norms over whole tensors, all-reduced
                sharded.clip_sharded_(cs, shards, scope)
            else:
                clip_unit_norm_(cs, scope)
        for b in buckets:
            us = b.momentum.update(b.view, b.states, b.cs, foreach)
            beta1 = b.momentum.beta(b.view)
            if b.preconditioner.whole_tensors:  # as DTensors: global shapes, whole-matrix work
                us = [u if s is None else sharded.whole(u, s) for u, s in zip(us, b.shards)]
            step = b.preconditioner.direction(b.states, us, b.cs, b.gs, beta1=beta1,
                                              foreach=foreach)  # fmt: skip
            step.nums = [sharded.local(n) for n in step.nums]
            apply_step(b.params, step, foreach)
            if b.view.get("variance_reduction"):
                self._advance_references(b.owners, b.states, b.gs, foreach)
        if staged is not None:
            staged.commit(skip, compiled=self._compiled_commit(buckets))
        self._reference_pending = False
        return loss

    def _compiled_commit(self, buckets: list[Bucket]) -> bool:
        """Whether the masked commit of staged buckets is compiled: on CUDA, where the compiled
        step may run (a list of ``where`` in one wrapper call instead of two launches each)."""
        device = buckets[0].params[0].device.type
        if device != "cuda" or self._compiled_off or not self._compiled_asked(device):
            return False
        return compiled_route.unavailable_reason("cuda") is None

    def _advance_references(self, owners: list[dict], states: list[dict], gs: Tensors,
                            foreach: bool) -> None:  # fmt: skip
        """Every tensor's ``_advance_reference`` on the optimizer's own state dicts (``owners``;
        exact mode swaps buffers there); approx mode's copies as one foreach copy (``states``:
        the same buffers, local blocks under FSDP2)."""
        if foreach and self.is_approx:
            torch._foreach_copy_([s["last_grad"] for s in states], gs)
            return
        for s, g in zip(owners, gs):
            self._advance_reference(s, g)

    def _buckets(self, group: dict) -> list[Bucket]:
        """Initialise state and count steps (every rule: ``state["step"]``), by rule."""
        buckets: dict[str, Bucket] = {}
        for p in group["params"]:
            if p.grad is None:
                continue
            key, view = route(p, group)
            if key not in buckets:
                momentum = MOMENTA[view["momentum_form"]]
                precond = PRECONDITIONERS[view["preconditioner"]](view)
                buckets[key] = Bucket(view, momentum, precond)
            b, state = buckets[key], self.state[p]
            if b.momentum.key not in state:
                self._init_state(p, state, b)
            state["step"] = state.get("step", 0) + 1  # a state of an older version may lack it
            b.shards.append(p if sharded.is_sharded(p) else None)
            b.owners.append(state)
            if b.shards[-1] is None:
                b.params.append(p), b.states.append(state), b.gs.append(p.grad)
            else:  # FSDP2: the element-wise work on the local blocks (optim/sharded.py)
                b.params.append(sharded.local(p)), b.gs.append(sharded.local(p.grad))
                b.states.append(sharded.local_state(state))
        return list(buckets.values())

    def device_skip_reason(self) -> str | None:
        """Why a step cannot honour a device-side ``found_inf`` flag without a host read (the
        protocol of torch's grad scaler: set ``optimizer.found_inf``, a 0-d tensor, 1 to skip;
        trainer/nonfinite.py): never here. The compiled path masks its writes in its kernels,
        the eager paths step on copies committed under the flag (optim/masked.py); the step
        counts, host ints, are put back by ``uncount_last_step`` once the flag has been read."""
        return None

    def device_skip_cost(self) -> str | None:
        """What honouring ``found_inf`` costs beyond the masks of the fast routes, or None: a
        tensor whose route (``routes.decide``) is eager steps on copies that are committed
        under the flag (optim/masked.py); exact mode's swap becomes masked copies."""
        if not self.is_approx and any(g.get("variance_reduction") for g in self.param_groups):
            return "exact mode's reference swap becomes masked copies"
        foreach = self._use_foreach()
        for group in self.param_groups:
            for p in group["params"]:
                view = route(p, group)[1]
                if engine_path.covers(self, p, view):  # masked in its kernels
                    continue
                b = probe(p, view)
                taken = routes.decide(self, b, foreach, engine="not covered")
                if taken.name != "compiled":
                    return f"{routes.label(b)} steps on copies ({taken.reason})"
        return None

    def uncount_last_step(self) -> None:
        """Take back the step count of the last ``step()`` (it was skipped on the device)."""
        for state in getattr(self, "_last_counted", []):
            state["step"] -= 1

    def _run_compiled(self, b: Bucket, skip: torch.Tensor | None = None) -> str | None:
        """Step bucket ``b`` on the compiled route (``routes.decide`` chose it); None, or why it
        failed to compile: the step was then done eagerly by the same code, and the compiled
        step is off from then on."""
        key = compiled_route.signature(b, self.correction)
        error = compiled_route.step(b, is_approx=self.is_approx, skip=skip,
                                    may_fall_back=key not in self._compiled_ok,
                                    correction=self.correction)  # fmt: skip
        if error:
            self._compiled_off = f"torch.compile failed: {error}"
            logger.warning("compiled optimizer step off (%s); using foreach", self._compiled_off)
        else:
            self._compiled_ok.add(key)
        self._swap_exact(b, skip)
        return error

    def _swap_exact(self, b: Bucket, skip: torch.Tensor | None) -> None:
        """Exact mode's reference swap after a fast path's step of ``b`` (masked under a flag)."""
        if b.view.get("variance_reduction") and not self.is_approx:
            if skip is None:
                for s, g in zip(b.owners, b.gs):
                    self._advance_reference(s, g)
            else:  # exact mode's swap as masked copies: no host read
                masked.masked_swap(skip, [(sharded.local(s["last_grad"]),
                                           sharded.local(s["previous_grad"]))
                                          for s in b.owners if "previous_grad" in s])  # fmt: skip

    def _compiled_asked(self, device_type: str) -> bool:
        """Whether ``implementation`` asks for the compiled step on the device."""
        return implementations.compiled_wanted(self.implementation, device_type)

    def _want_compiled(self, b: Bucket) -> bool:
        """Whether the setting asks for the compiled step on ``b``'s device and it can run there
        (a class that overrides ``FAST_REPLACES``, or a missing compiler, turns it off once);
        the rest of the question is ``routes.decide``'s."""
        if self._compiled_off or self.implementation in ("loop", "foreach"):
            return False
        if self.private_overrides():  # auto: the eager paths, which call the overrides
            self._compiled_off = f"{type(self).__name__} overrides {self.private_overrides()}"
            logger.info("compiled optimizer step off: %s; using foreach", self._compiled_off)
            return False
        device = b.params[0].device.type
        if not self._compiled_asked(device):
            return False
        reason = compiled_route.unavailable_reason(device)
        if reason:
            self._compiled_off = reason
            logger.warning("compiled optimizer step off: %s; using foreach", reason)
            return False
        return True

    def _init_state(self, p: torch.Tensor, state: dict, b: Bucket) -> None:
        state.setdefault("step", 0)
        b.momentum.init_state(p, state)
        b.preconditioner.init_state(p, state)
        if b.view.get("variance_reduction"):
            plain = b.view["first_step"] == "plain"
            state["last_grad"] = p.grad.clone() if plain else torch.zeros_like(p)

    def _corrections(self, b: Bucket, foreach: bool) -> Tensors:
        """``self.correction`` of each tensor, new tensors (unclipped); the default's foreach
        form when foreach is on (tested equal), a subclass's own function per tensor."""
        kappa = mars_kappa(b.view["gamma"], b.momentum.beta(b.view))
        refs = [s["last_grad"] for s in b.states]
        if foreach and self.correction is mars_correct:
            return mars_correction(b.gs, refs, kappa)
        return [self.correction(g, ref, kappa) for g, ref in zip(b.gs, refs)]

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's, keeping group keys a checkpoint of an earlier version lacks."""
        current = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        super().load_state_dict(state_dict)
        for group, keys in zip(self.param_groups, current):
            for k, v in keys.items():
                group.setdefault(k, v)


def _skip_flag(found_inf: torch.Tensor | None) -> torch.Tensor | None:
    """torch's ``found_inf`` (a 0-d float tensor, 1.0: skip) as a 0-d bool tensor, no read."""
    return None if found_inf is None else found_inf.reshape(()) != 0


def check_rule(group: dict) -> None:
    """The group names a known momentum form and preconditioner, whose options are valid."""
    form, name = group.get("momentum_form"), group.get("preconditioner")
    if form not in MOMENTA:
        raise ValueError(f"unknown momentum_form {form!r}; valid values: {sorted(MOMENTA)}")
    if name not in PRECONDITIONERS:
        raise ValueError(f"unknown preconditioner {name!r}; valid: {sorted(PRECONDITIONERS)}")
    MOMENTA[form].check(group)
    PRECONDITIONERS[name].Options.from_group(group)  # its validators, with the group's values
