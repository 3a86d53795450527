"""Preconditioners: each turns a momentum ``u`` into a direction ``d`` for the core's step.

The core (optim/core.py) applies ``p <- p * (1 - decay) - step_size * d`` with ``d = num / den``
(Adam) or ``d = num`` (the others); a preconditioner returns those pieces as a ``Step`` so that
each official code's arithmetic is kept bit for bit. Every class has a fast path (``foreach``:
torch._foreach ops) and a plain one (a loop over tensors), tested equal in float64.

- ``Adam``:  v = beta2 * v + (1 - beta2) * s*s, s = c (official MARS) or g; with ``amsgrad``
  v_max = max(v_max, v) replaces v. ``eps="after_sqrt_v_hat"`` (MARS):
  d = m / ((sqrt(v) / sqrt(1 - beta2^t) + eps) * (1 - beta1^t)), step lr.
  ``eps="before_bias_correction"`` (Moonlight, MARS-M, the MARS repo's AdamW):
  d = m / (sqrt(v) + eps), step lr * sqrt(1 - beta2^t) / (1 - beta1^t); with
  ``decay_bias_corrected`` the decay is scaled by that step too (the MARS repo's AdamW).
- ``Sign`` (Lion): d = sign(u).
- ``NewtonSchulz``: d = s * NS5(u) (NS5 of ``u / (1 - beta1)`` with ``debias``, as MARS-Shampoo),
  s = sqrt(max(1, rows/cols)) (``scale="shape"``: Muon, MARS-Shampoo) or 0.2 * sqrt(max(A, B))
  (``scale="rms"``: Moonlight, MARS-M). It orthogonalises exactly the 2-D tensors; any other
  tensor in its group takes the group's Adam (the official MARS-Shampoo rule; the Muon-family
  drop-ins route non-2-D tensors to their AdamW part). Group keys ``ns_batched`` (default
  True: one batched call per shape; False: one matrix at a time) and ``ns_distributed``
  (default True: under DDP each rank takes a share of the matrices, then all-gather) choose how
  NS is computed, not what (optim/newton_schulz.py); ``ns_fused`` (default None: on CUDA) runs
  the iteration's multiply-adds as ``baddbmm`` (3 ops a step instead of 8, for GPU launch
  overhead), which rounds differently in the last bits.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from optim.functional import resolve_dtype, rms_scale, shape_scale
from optim.newton_schulz import orthogonalise
from optim.options import check_fields, choice

Tensors = list[torch.Tensor]
EPS_PLACEMENTS = ("after_sqrt_v_hat", "before_bias_correction")
SECOND_MOMENTS = ("c", "g")
SCALES = {"shape": shape_scale, "rms": rms_scale}
choice("eps_placement", EPS_PLACEMENTS)
choice("second_moment", SECOND_MOMENTS)
choice("scale", SCALES)


@dataclass
class Step:
    """``p <- p * keep - step_size * num / den`` (``den`` None: ``- step_size * num``)."""

    nums: Tensors
    dens: Tensors | None
    step_sizes: list[float]
    keeps: list[float]


@dataclass(frozen=True)
class Options:
    """A preconditioner's typed options: each field is a param-group key with its default, and
    its value is checked by the option's one validator (optim/options.py)."""

    def __post_init__(self) -> None:
        check_fields(self)

    @classmethod
    def from_group(cls, group: dict):
        """The options as ``group`` sets them (a key the group lacks takes the field's default)."""
        return cls(**{f.name: group[f.name] for f in dataclasses.fields(cls) if f.name in group})

    def group_keys(self) -> dict:
        """The options as param-group keys (tuples for lists)."""
        return {k: tuple(v) if isinstance(v, list) else v for k, v in vars(self).items()}


class Preconditioner:
    """Base class: typed ``Options`` read from the param group; ``direction`` gives the step.

    ``group`` is the param group as the core's routing reads it (lr, weight_decay, betas, ...);
    every state has ``state["step"]`` (the core counts steps, whatever the momentum form).
    """

    Options = Options
    # False: ``direction`` gets the rank-local blocks of sharded (FSDP2) tensors, fine for
    # element-wise work; True: it gets them as DTensors (global shape; whole-tensor work is its
    # own, e.g. optim/newton_schulz.py) and may return DTensors (optim/sharded.py)
    whole_tensors: bool = False

    def __init__(self, group: dict) -> None:
        self.group = group
        self.options = self.Options.from_group(group)

    @staticmethod
    def handles(p: torch.Tensor) -> bool:
        """Whether this preconditioner takes ``p`` (else the group's Adam does)."""
        return True

    def init_state(self, p: torch.Tensor, state: dict) -> None:
        """Create this preconditioner's state for ``p`` (nothing by default)."""

    def direction(self, states: list[dict], us: Tensors, cs: Tensors, gs: Tensors, *,
                  beta1: float, foreach: bool) -> Step:  # fmt: skip
        raise NotImplementedError


def _plain_decay(n: int, group: dict) -> list[float]:
    return [1 - group["lr"] * group["weight_decay"]] * n


@dataclass(frozen=True)
class AdamOptions(Options):
    eps: float = 1e-8
    amsgrad: bool = False
    second_moment: str = "c"  # c: v from the clipped c (official MARS) | g: the raw gradient
    eps_placement: str = "after_sqrt_v_hat"  # MARS | before_bias_correction (Moonlight, MARS-M)
    decay_bias_corrected: bool = False  # the MARS repo's AdamW scales decay by its bias factor


class Adam(Preconditioner):
    """Adam's second moment and bias corrections; see the module docstring for both forms."""

    Options = AdamOptions

    def __init__(self, group: dict) -> None:
        super().__init__(group)
        o = self.options
        self.beta2 = group["betas"][1]
        self.eps, self.amsgrad, self.second_moment = o.eps, o.amsgrad, o.second_moment
        self.eps_placement, self.decay_bias_corrected = o.eps_placement, o.decay_bias_corrected

    def init_state(self, p: torch.Tensor, state: dict) -> None:
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        if self.amsgrad:
            state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)

    def direction(self, states, us, cs, gs, *, beta1, foreach):
        src = cs if self.second_moment == "c" else gs
        vs = [s["exp_avg_sq"] for s in states]
        lerp = self.eps_placement == "before_bias_correction"
        _second_moment(vs, src, self.beta2, lerp, foreach)
        if self.amsgrad:
            vmax = [s["max_exp_avg_sq"] for s in states]
            if foreach:
                torch._foreach_maximum_(vmax, vs)
            else:
                for m, v in zip(vmax, vs):
                    torch.maximum(m, v, out=m)
            vs = vmax
        steps = [s["step"] for s in states]
        if lerp:
            return self._before_bias_correction(us, vs, steps, beta1, foreach)
        return self._after_sqrt_v_hat(us, vs, steps, beta1, foreach)

    def _after_sqrt_v_hat(self, ms, vs, steps, beta1, foreach) -> Step:
        bc1 = [1 - beta1**t for t in steps]
        bc2_sqrt = [math.sqrt(1 - self.beta2**t) for t in steps]
        if foreach:
            denom = torch._foreach_sqrt(vs)
            torch._foreach_div_(denom, bc2_sqrt)
            torch._foreach_add_(denom, self.eps)
            torch._foreach_mul_(denom, bc1)
        else:
            denom = [(v.sqrt() / b2 + self.eps) * b1 for v, b1, b2 in zip(vs, bc1, bc2_sqrt)]
        n, lr = len(ms), self.group["lr"]
        return Step(ms, denom, [lr] * n, _plain_decay(n, self.group))

    def _before_bias_correction(self, ms, vs, steps, beta1, foreach) -> Step:
        lr, wd = self.group["lr"], self.group["weight_decay"]
        sizes = [lr * math.sqrt(1 - self.beta2**t) / (1 - beta1**t) for t in steps]
        decays = [s * wd for s in sizes] if self.decay_bias_corrected else [lr * wd] * len(ms)
        if foreach:
            denom = torch._foreach_sqrt(vs)
            torch._foreach_add_(denom, self.eps)
        else:
            denom = [v.sqrt().add_(self.eps) for v in vs]
        return Step(ms, denom, sizes, [1 - d for d in decays])


def _second_moment(vs: Tensors, src: Tensors, beta2: float, lerp: bool, foreach: bool) -> None:
    """``v = beta2 * v + (1 - beta2) * s*s``, in the arithmetic of the official code it serves."""
    if lerp:  # Moonlight / MARS-M / MARS repo AdamW: v.lerp_(g*g, 1 - beta2)
        if foreach:
            torch._foreach_lerp_(vs, torch._foreach_mul(src, src), 1 - beta2)
        else:
            for v, s in zip(vs, src):
                v.lerp_(s * s, 1 - beta2)
    elif foreach:
        torch._foreach_mul_(vs, beta2)
        torch._foreach_addcmul_(vs, src, src, value=1 - beta2)
    else:
        for v, s in zip(vs, src):
            v.mul_(beta2).addcmul_(s, s, value=1 - beta2)


class Sign(Preconditioner):
    """Lion's direction ``sign(u)``."""

    def direction(self, states, us, cs, gs, *, beta1, foreach):
        signs = torch._foreach_sign(us) if foreach else [torch.sign(u) for u in us]
        n = len(us)
        return Step(signs, None, [self.group["lr"]] * n, _plain_decay(n, self.group))


@dataclass(frozen=True)
class NewtonSchulzOptions(Options):
    eps: float = 1e-7
    ns_steps: int = 5
    ns_dtype: str = "bfloat16"  # "param": each matrix's own dtype; float32 is full float32
    scale: str = "shape"  # shape: sqrt(max(1, rows/cols)) | rms: 0.2 * sqrt(max(rows, cols))
    ns_debias: bool = False  # NS5(u / (1 - beta1)), as MARS-Shampoo
    ns_batched: bool = True  # one batched call per shape (False: one matrix at a time)
    ns_distributed: bool = True  # under DDP each rank orthogonalises a share, then all-gather
    ns_fused: bool | None = None  # the iteration as baddbmm (3 ops a step); None: on CUDA only


class NewtonSchulz(Preconditioner):
    """``d = scale * NS5(u)`` on 2-D tensors (Muon, Moonlight, MARS-M, MARS-Shampoo)."""

    Options = NewtonSchulzOptions
    whole_tensors = True  # whole matrices under FSDP2, and the scale of the full shape

    def __init__(self, group: dict) -> None:
        super().__init__(group)
        o = self.options
        self.steps, self.eps, self.dtype_name = o.ns_steps, o.eps, o.ns_dtype
        self.scale = SCALES[o.scale]
        self.debias, self.batched, self.distributed = o.ns_debias, o.ns_batched, o.ns_distributed
        self.fused = o.ns_fused

    @staticmethod
    def handles(p: torch.Tensor) -> bool:
        return p.ndim == 2

    def direction(self, states, us, cs, gs, *, beta1, foreach):
        # Batched by shape and split over ranks (optim/newton_schulz.py); ``ns_batched=False``
        # takes the per-matrix loop. Independent of ``foreach``: the numbers are the same.
        param = self.dtype_name == "param" or not us  # "param": each matrix's own dtype
        dtype = None if param else resolve_dtype(self.dtype_name, us[0])
        outs = orthogonalise(
            us,
            steps=self.steps,
            eps=self.eps,
            dtype=dtype,
            divisor=(1 - beta1) if self.debias else None,
            batched=self.batched,
            distributed=self.distributed,
            fused=self.fused if self.fused is not None else bool(us) and us[0].is_cuda,
            cast_back=True,  # one cast per shape, not one per matrix
        )
        lr = self.group["lr"]
        nums = outs
        sizes = [lr * self.scale(u.shape) for u in us]
        return Step(nums, None, sizes, _plain_decay(len(us), self.group))


PRECONDITIONERS: dict[str, type[Preconditioner]] = {}


def register_preconditioner(name: str):
    """Class decorator: make a ``Preconditioner`` available to rules as ``name``."""

    def wrap(cls: type[Preconditioner]) -> type[Preconditioner]:
        if name in PRECONDITIONERS:
            raise ValueError(f"preconditioner {name!r} is registered twice")
        PRECONDITIONERS[name] = cls
        return cls

    return wrap


register_preconditioner("adam")(Adam)
register_preconditioner("sign")(Sign)
register_preconditioner("newton-schulz")(NewtonSchulz)


def options_from(preconditioner: str, source: Any, **fixed: Any) -> Options:
    """The Options of the registered ``preconditioner`` from the fields of the same names of the
    dataclass ``source`` (an optimizer's config), plus ``fixed``."""
    cls = PRECONDITIONERS[preconditioner].Options
    names = {f.name for f in dataclasses.fields(cls)} & {f.name for f in dataclasses.fields(source)}
    return cls(**{n: getattr(source, n) for n in names}, **fixed)


def option_keys() -> set[str]:
    """Every option of every registered preconditioner (the group keys they may read)."""
    return {f.name for cls in PRECONDITIONERS.values() for f in dataclasses.fields(cls.Options)}
