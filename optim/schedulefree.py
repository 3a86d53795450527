"""Schedule-Free AdamW (Defazio et al. 2024, arXiv 2405.15682), and the train/eval weight switch.

Reference: facebookresearch/schedule_free ``AdamWScheduleFree`` (the ``schedulefree`` package,
tested equal to ours in tests/test_optim_schedulefree.py). The model holds y (where gradients
are taken); the state holds z (the SGD-like iterate) and v; x, the average that is evaluated,
is ``x = (y - (1 - beta1) z) / beta1``. Per group, at step k (0-based), with
``lr_k = lr * min(1, (k + 1) / warmup_steps)``:

    lr_max = max(lr_max, lr_k);  w = (k + 1)^r * lr_max^weight_lr_power;  W += w;  c = w / W
    v = beta2 * v + (1 - beta2) * g*g
    d = g / (sqrt(v / (1 - beta2^(k+1))) + eps) + wd * y
    y = lerp(y, z, c) + lr_k * (beta1 * (1 - c) - 1) * d
    z = z - lr_k * d

``eval()`` moves the model to x (``p = lerp(p, z, 1 - 1/beta1)``), ``train()`` back to y
(``p = lerp(p, z, 1 - beta1)``). Evaluating or saving at y is the classic mistake: the trainer
evaluates and saves inside ``eval_weights(optimizer)`` (below), so validation losses, checkpoints
and everything read from a checkpoint (eval.py, the export) see x. Evaluation puts y back from a
copy (evaluating changes nothing); a save recomputes y from x and z, and a resumed run calls
``train()`` after loading, the same arithmetic, so it continues bit for bit.

Differences from the reference: the optimizer starts in train mode (the reference refuses to
step before ``train()``; before the first step both are the same weights), and ``p.grad`` is
not overwritten (the reference divides it in place). It has no device-side skip: the non-finite
guard takes its host decision (trainer/nonfinite.py). Element-wise only: under FSDP2 it runs on
the shards (DTensor operations, as torch's AdamW).
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn as nn

from optim import engine, routes
from optim import implementation as implementations
from optim.engine import schedulefree as engine_schedulefree
from optim.engine.clip import ClipFoldMixin
from optim.engine.clip import apply_to as apply_clip
from optim.engine.rules import tensors_fit
from optim.engine.state import EngineState
from optim.groups import decay_groups, split_aux
from optim.options import OptimizerConfig, check_option, validator
from optim.registry import register


@validator("warmup_steps")
def _warmup_steps(value, key):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key} must be an integer >= 0, got {value!r}")


@validator("r", "weight_lr_power")
def _non_negative(value, key):
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{key} must be a finite number >= 0, got {value}")


class AdamWScheduleFree(ClipFoldMixin, torch.optim.Optimizer):
    """Schedule-Free AdamW (module docstring); the reference's constructor keywords."""

    has_eval_weights = True  # the trainer evaluates and saves inside eval_weights()

    def __init__(self, params, lr: float = 0.0025, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, warmup_steps: int = 0, r: float = 0.0,
                 weight_lr_power: float = 2.0, *,
                 implementation: str = implementations.DEFAULT) -> None:  # fmt: skip
        for key, value in dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                               warmup_steps=warmup_steps, r=r,
                               weight_lr_power=weight_lr_power).items():  # fmt: skip
            check_option(key, value)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, r=r, k=0, warmup_steps=warmup_steps,
                        train_mode=True, weight_sum=0.0, lr_max=-1.0, scheduled_lr=0.0,
                        weight_lr_power=weight_lr_power, weight_decay=weight_decay)  # fmt: skip
        implementations.check(implementation, implementations.SCHEDULE_FREE,
                              who=type(self).__name__)  # fmt: skip
        super().__init__(params, defaults)
        # implementation (optim/implementation.py): auto, the engine (optim/engine/) on CUDA
        # where Triton is present, else foreach; triton the engine on any device (a CPU through
        # Triton's interpreter); loop, foreach never (no compiled step here). ``last_routes``
        # holds each group's route of the last step and ``route_counts`` counts them over all
        # steps ("engine", "foreach", "loop": optim/routes.py), as the core's do.
        self.implementation = implementation
        self.foreach = implementations.eager_foreach(implementation) is not False
        self.engine_state = EngineState()  # the engine's tables (optim/engine/state.py)
        self.last_routes: list = []
        self.route_counts: Counter = Counter()
        self._kept: list[torch.Tensor] | None = (
            None  # y while in eval mode, keep_train_weights=True
        )

    @property
    def in_train_mode(self) -> bool:
        """Whether the model holds y (training) rather than x (evaluation)."""
        return self.param_groups[0]["train_mode"]

    @torch.no_grad()
    def eval(self, *, keep_train_weights: bool = False) -> None:
        """Put x, the weights to evaluate, into the model (no-op in eval mode).
        ``keep_train_weights``: keep a copy of y, so that ``train()`` puts it back bit for bit."""
        if keep_train_weights and self.param_groups[0]["train_mode"]:
            self._kept = [p.clone() for g in self.param_groups for p in g["params"]]
        self._switch(train=False)

    @torch.no_grad()
    def train(self) -> None:
        """Put y, the weights gradients are taken at, into the model (no-op in train mode): the
        copy ``eval(keep_train_weights=True)`` kept, else ``lerp(x, z, 1 - beta1)``."""
        kept = getattr(self, "_kept", None)
        self._kept = None
        if kept is not None and not self.param_groups[0]["train_mode"]:
            params = [p for g in self.param_groups for p in g["params"]]
            torch._foreach_copy_(params, kept)
            for group in self.param_groups:
                group["train_mode"] = True
            return
        self._switch(train=True)

    def _switch(self, *, train: bool) -> None:
        for group in self.param_groups:
            if group["train_mode"] == train:
                continue
            beta1 = group["betas"][0]
            weight = 1 - beta1 if train else 1 - 1 / beta1
            for p in group["params"]:
                if "z" in self.state[p]:
                    p.lerp_(end=self.state[p]["z"].to(p.device), weight=weight)
            group["train_mode"] = train

    @torch.no_grad()
    def step(self, closure=None):
        """One step of every group (module docstring)."""
        if not self.param_groups[0]["train_mode"]:
            raise RuntimeError("AdamWScheduleFree.step() in eval mode: call optimizer.train() "
                               "after evaluating (optim.eval_weights does both)")  # fmt: skip
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        gscale = self._take_clip_fold()  # the trainer's clip, folded: optim/engine/clip.py
        taken = [self._step_group(group, gscale) for group in self.param_groups]
        routes.record(self, [("group", self._route(name)) for name in taken if name])
        return loss

    def _route(self, name: str) -> routes.Route:
        """A group's route ``name`` with its reason: the setting, and why the engine is off
        where it is and the group took another route."""
        why = f"{type(self).__name__}, implementation={self.implementation}"
        off = self.engine_state.off
        return routes.Route(name, why if name == "engine" or not off
                            else f"{why}; not the engine: {off}")  # fmt: skip

    def _engine_takes(self, p: torch.Tensor, group: dict) -> bool:
        return engine.usable(self, p.device.type) and tensors_fit([p])

    @property
    def off_reason(self) -> str | None:
        """Why the engine is off when it was asked for (``implementation="triton"``), or None."""
        return self.engine_state.off

    def _weights(self, group: dict) -> tuple[float, float]:
        """This step's lr and averaging weight c; advances lr_max and weight_sum."""
        k, warmup = group["k"], group["warmup_steps"]
        lr = group["lr"] * ((k + 1) / warmup if k < warmup else 1.0)
        group["scheduled_lr"] = lr  # for logging, as the reference
        lr_max = group["lr_max"] = max(lr, group["lr_max"])
        weight = ((k + 1) ** group["r"]) * (lr_max ** group["weight_lr_power"])
        weight_sum = group["weight_sum"] = group["weight_sum"] + weight
        return lr, (weight / weight_sum if weight_sum != 0 else 0.0)

    def _step_group(self, group: dict, gscale: torch.Tensor | None = None) -> str | None:
        """One group's step; the route it took (None: no gradient in it)."""
        beta1, beta2 = group["betas"]
        decay, k = group["weight_decay"], group["k"]
        lr, ckp1 = self._weights(group)
        bc2 = 1 - beta2 ** (k + 1)
        ps = [p for p in group["params"] if p.grad is not None]
        for p in ps:
            if "z" not in self.state[p]:
                self.state[p]["z"] = torch.clone(p, memory_format=torch.preserve_format)
                self.state[p]["exp_avg_sq"] = torch.zeros_like(
                    p, memory_format=torch.preserve_format
                )
        group["k"] = k + 1
        if not ps:
            return None
        grads = [p.grad for p in ps]
        zs = [self.state[p]["z"] for p in ps]
        vs = [self.state[p]["exp_avg_sq"] for p in ps]
        if engine_schedulefree.step(self, ps, grads, zs, vs, beta1=beta1, beta2=beta2, bc2=bc2,
                                    eps=group["eps"], decay=decay, ckp1=ckp1, lr=lr,
                                    gscale=gscale):  # fmt: skip
            return "engine"
        apply_clip(grads, gscale)  # a folded clip, applied as torch's clip applies it
        if self.foreach:
            torch._foreach_mul_(vs, beta2)
            torch._foreach_addcmul_(vs, grads, grads, value=1 - beta2)
            denom = torch._foreach_div(vs, bc2)
            torch._foreach_sqrt_(denom)
            torch._foreach_add_(denom, group["eps"])
            d = torch._foreach_div(grads, denom)
            if decay != 0:
                torch._foreach_add_(d, ps, alpha=decay)
            torch._foreach_lerp_(ps, zs, weight=ckp1)
            torch._foreach_add_(ps, d, alpha=lr * (beta1 * (1 - ckp1) - 1))
            torch._foreach_sub_(zs, d, alpha=lr)
            return "foreach"
        for y, g, z, v in zip(ps, grads, zs, vs):
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            d = g.div(v.div(bc2).sqrt_().add_(group["eps"]))
            if decay != 0:
                d.add_(y, alpha=decay)
            y.lerp_(end=z, weight=ckp1)
            y.add_(d, alpha=lr * (beta1 * (1 - ckp1) - 1))
            z.sub_(d, alpha=lr)
        return "loop"


@contextlib.contextmanager
def eval_weights(optimizer, *, exact: bool = True) -> Iterator[None]:
    """Inside: the model holds the weights to evaluate and save (schedule-free's x); after: the
    weights to train at (y). A no-op for optimizers whose model weights are the evaluated ones.

    ``exact`` (evaluation): y is put back bit for bit from a copy (one copy of the weights while
    inside), so evaluating never changes training. ``exact=False`` (around a checkpoint save): y
    is recomputed from x and z, the arithmetic a run resumed from that checkpoint does, so the
    resumed run continues bit for bit as the uninterrupted one."""
    if not getattr(optimizer, "has_eval_weights", False) or not optimizer.in_train_mode:
        yield  # nothing to switch, or already at x (the caller switches back)
        return
    optimizer.eval(keep_train_weights=exact)
    try:
        yield
    finally:
        optimizer.train()


def train_weights(optimizer) -> None:
    """After restoring a checkpoint saved inside ``eval_weights``: back to the training weights."""
    if getattr(optimizer, "has_eval_weights", False):
        optimizer.train()


# --- the registry's ``adamw-schedulefree``: every tensor on it (as the reference and the paper
# do), decay on ``decay_kinds`` (block matrices, as the AdamW baseline) -----------------------------


@dataclass
class AdamWScheduleFreeConfig(OptimizerConfig):
    """Schedule-Free AdamW (Defazio et al. 2024). lr 2.5e-3, eps, r 0 and the warmup (0) are
    the reference's defaults; betas (0.9, 0.95) and wd 0.1 on block matrices are the AdamW
    baseline's GPT-2 values (the reference's defaults, (0.9, 0.999) and 0, are not GPT-2's).
    Use it with ``schedule=constant``: it needs no decaying schedule."""

    name: str = "adamw-schedulefree"
    lr: float = 2.5e-3
    weight_decay: float = 0.1
    aux_lr: float | None = None  # set: every non-matrix parameter's peak lr; None: lr
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    decay_kinds: list[str] = field(default_factory=lambda: ["matrix"])
    warmup_steps: int = 0  # the optimizer's own warmup (the trainer's schedule may warm up too)
    r: float = 0.0

    valid_implementations: ClassVar[tuple[str, ...]] = implementations.SCHEDULE_FREE  # no compiled


@register(
    "adamw-schedulefree",
    AdamWScheduleFreeConfig,
    "Schedule-Free AdamW (no decaying schedule: `schedule=constant`)",
)
def build_schedulefree(model: nn.Module, cfg: AdamWScheduleFreeConfig) -> torch.optim.Optimizer:
    groups = split_aux(model, decay_groups(model, cfg.weight_decay, cfg.decay_kinds), cfg.aux_lr)
    return AdamWScheduleFree(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                             warmup_steps=cfg.warmup_steps, r=cfg.r,
                             implementation=cfg.implementation)  # fmt: skip
