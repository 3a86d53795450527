"""Which buckets of the core the engine runs, as which kernel variant, with which scalars.

A bucket (optim/core.py ``Bucket``: the tensors of one group that share a rule) maps to a
``Kind``, the kernel's compile-time flags, and per step to ``Scalars``, the host floats passed as
kernel arguments (nothing is copied to the device for them, and a new value never recompiles).
Covered (``kind_of``; everything else stays on the compiled / foreach / loop paths):

- momentum ``ema``, ``mars-m`` (mul-add), ``ema-lerp``, ``lion``, ``heavy-ball`` (with or without
  Nesterov) and ``one-buffer``, on the gradient or on the MARS correction (the default
  ``correction`` only), clipped per tensor, globally or not at all, approx or exact;
- preconditioners ``adam`` (both eps placements, amsgrad, either second moment, the bias-scaled
  decay), ``sign``, ``ademamix``, ``soap`` on its unrotated tensors (1-D ones with the default
  ``precondition_1d=False``, without ``normalize_grads``), and ``newton-schulz`` (exactly that
  class; batched, split over DDP ranks or not): the element-wise passes around it (optim/engine/ns.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from optim import momentum as forms
from optim.ademamix import AdEMAMix, alpha_at, beta3_at
from optim.engine import layout as L
from optim.functional import mars_correct, mars_kappa, resolve_dtype
from optim.preconditioners import Adam, NewtonSchulz, Sign
from optim.soap import Soap, preconditioned, work_shape

CLIPS = {"none": L.CLIP_NONE, "tensor": L.CLIP_TENSOR, "global": L.CLIP_GLOBAL}
DTYPES = (torch.float32, torch.float64)


@dataclass(frozen=True)
class Kind:
    """A kernel variant: the rule's compile-time flags (optim/engine/kernels.py step_kernel)."""

    momentum: int
    direction: int
    reduce: bool = False
    clip: int = L.CLIP_NONE
    copy_ref: bool = False
    amsgrad: bool = False
    src_c: bool = True


@dataclass
class Scalars:
    """The step's hyperparameters as the kernel's scalar arguments (unused ones stay 0)."""

    kappa: float = 0.0
    beta: float = 0.0
    m_add: float = 0.0
    lion_u: float = 0.0
    lion_m: float = 0.0
    b2: float = 0.0
    v_add: float = 0.0
    keep: float = 1.0
    neg_size: float = 0.0
    bc2s: float = 1.0
    bc1: float = 1.0
    eps: float = 0.0
    mix: float = 0.0
    b3: float = 0.0
    s_add: float = 0.0

    def args(self) -> tuple[float, ...]:
        return tuple(float(v) for v in vars(self).values())


def _momentum(b) -> int | None:
    m, view = b.momentum, b.view
    if type(m) is forms.EMA:
        return L.EMA_LERP if m.lerp else L.EMA
    if type(m) is forms.LionMomentum:
        return L.LION
    if type(m) is forms.HeavyBall:
        return L.HEAVY_NESTEROV if view["nesterov"] else L.HEAVY_BALL
    if type(m) is forms.OneBuffer:
        return L.ONE_BUFFER
    return None


def _direction(b) -> int | None:
    pre = b.preconditioner
    if type(pre) is Adam:
        return L.ADAM_LERP if pre.eps_placement == "before_bias_correction" else L.ADAM
    if type(pre) is Sign:
        return L.SIGN
    if type(pre) is AdEMAMix:
        return L.ADEMAMIX
    if type(pre) is Soap and not pre.options.normalize_grads:
        return L.SOAP_ADAM
    if type(pre) is NewtonSchulz and pre.batched:  # split over DDP ranks too (engine/ns.py)
        return L.NS_OUT
    return None


def kind_of(b, *, is_approx: bool, correction=mars_correct) -> Kind | None:
    """The bucket's kernel variant, or None where the engine does not cover its rule."""
    view = b.view
    momentum, direction = _momentum(b), _direction(b)
    reduce = bool(view.get("variance_reduction", False))
    if momentum is None or direction is None or (reduce and correction is not mars_correct):
        return None
    pre = b.preconditioner
    adam = type(pre) is Adam
    return Kind(
        momentum=momentum,
        direction=direction,
        reduce=reduce,
        clip=CLIPS[view["clip"]] if reduce else L.CLIP_NONE,
        copy_ref=reduce and is_approx,
        amsgrad=adam and pre.amsgrad,
        src_c=not adam or pre.second_moment == "c",
    )


def takes(b, index: int) -> bool:
    """Whether the engine takes tensor ``index`` of a covered bucket (SOAP: unrotated only)."""
    if type(b.preconditioner) is not Soap:
        return True
    p, o = b.params[index], b.preconditioner.options
    return not any(preconditioned(p.ndim, work_shape(tuple(p.shape), o), o))


def tensors_fit(tensors: list) -> bool:
    """One device and dtype (float32 or float64), contiguous, plain tensors (not DTensors: a
    sharded bucket's tensors are its local blocks)."""
    first = tensors[0]
    return first.dtype in DTYPES and all(
        t.device == first.device and t.dtype == first.dtype and t.is_contiguous()
        and not hasattr(t, "placements") for t in tensors
    )  # fmt: skip


def shards_fit(shards: list[bool]) -> bool:
    """Whether the engine takes a bucket whose tensors are FSDP2 shards where ``shards`` says:
    none, or all of them (an element-wise rule on the local blocks, the clip's norms
    all-reduced: optim/engine/launch.py; Newton-Schulz on its owners' whole matrices:
    optim/engine/ns_shards.py)."""
    return not any(shards) or all(shards)


def ns_dtype(b) -> torch.dtype:
    """The dtype of a Newton-Schulz bucket's stacks (its ``ns_dtype``; "param": the params')."""
    name = b.preconditioner.dtype_name
    return b.params[0].dtype if name == "param" else resolve_dtype(name, b.params[0])


def scalars(b, kind: Kind, t: int) -> Scalars:
    """The scalars of step ``t`` (the tensors' ``state["step"]``) for bucket ``b``."""
    view, s = b.view, Scalars()
    lr, wd = view["lr"], view["weight_decay"]
    beta = b.momentum.beta(view)
    s.keep, s.neg_size, s.beta, s.m_add = 1 - lr * wd, -lr, beta, 1 - beta
    if kind.reduce:
        s.kappa = mars_kappa(view["gamma"], beta)
    if kind.momentum == L.LION:
        s.lion_u, s.lion_m = view["betas"][0], 1 - view["betas"][1]
    if kind.momentum == L.ONE_BUFFER:
        mu, gamma = view["momentum"], view["gamma"]
        s.m_add, s.mix = (1 - gamma) * (1 - mu) / mu, gamma
    pre = b.preconditioner
    if kind.direction == L.NS_OUT:
        s.bc1 = (1 - beta) if pre.debias else 1.0  # the divisor of NS(u / (1 - beta1))
        return s
    if kind.direction == L.SIGN:
        return s
    s.b2 = view["betas"][1]
    s.v_add, s.eps = 1 - s.b2, pre.options.eps
    _preconditioned(s, pre, kind, view, beta, t)
    return s


def _preconditioned(s: Scalars, pre, kind: Kind, view: dict, beta: float, t: int) -> None:
    """The Adam-like directions' scalars (optim/preconditioners.py, ademamix.py, soap.py)."""
    lr, wd, b2 = view["lr"], view["weight_decay"], s.b2
    if kind.direction == L.ADAM:
        s.bc2s, s.bc1 = math.sqrt(1 - b2**t), 1 - beta**t
    elif kind.direction == L.ADAM_LERP:
        size = lr * math.sqrt(1 - b2**t) / (1 - beta**t)
        s.neg_size = -size
        s.keep = 1 - (size * wd if pre.decay_bias_corrected else lr * wd)
    elif kind.direction == L.ADEMAMIX:
        o = pre.options
        s.bc2s, s.bc1 = math.sqrt(1 - b2**t), 1 - beta**t
        s.mix = alpha_at(t, o.alpha, o.alpha_warmup)
        s.b3 = beta3_at(t, o.beta3, beta, o.beta3_warmup)
        s.s_add = 1 - s.b3
    elif kind.direction == L.SOAP_ADAM and t > 1:
        s.neg_size = -pre._step_size(t - 1, beta) * (1 - lr * wd)
