"""Muon-style optimizers: Muon, Moonlight, MARS-M and its one-buffer form, with an AdamW backup.

Matrices in ``use_muon`` groups are updated with an orthogonalised momentum; the other groups run
AdamW. With mu the momentum, ``NS`` five Newton-Schulz steps (optim/functional.py), ``s`` the scale
and ``t`` the AdamW step count:

    muon / moonlight:  buf = mu * buf + g;  u = g + mu * buf (Nesterov) or buf
    mars-m:            c = clip(g + gamma*mu/(1-mu) * (g - g_ref));  buf = mu * buf + (1 - mu) * c;
                       u = buf                      (MARS-M, arXiv 2510.21800, Algorithm 2)
    mars-m-efficient:  buf = mu * buf + (1-gamma)(1-mu)/mu * g;  u = gamma * g + mu * buf
                       (the same direction as approx mars-m without clipping, one buffer)
    every matrix:      p = p * (1 - lr * wd) - lr * s * NS(u)
                       s = sqrt(max(1, rows/cols)) ("shape": Muon) or 0.2*sqrt(max(rows, cols))
                       ("rms": Moonlight, MARS-M)
    AdamW backup:      m = lerp(m, g, 1-b1); v = lerp(v, g*g, 1-b2);
                       p = p * (1 - lr * wd) - lr * sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + eps)
                       (``decay_bias_corrected``: the decay is multiplied by the same bias factor,
                       as the MARS repo's own AdamW under its Muon baseline)

Tensors with more than two dims are orthogonalised as ``(shape[0], -1)`` matrices. Every rank
computes every update (as Moonlight and MARS-M; the MARS repo's Muon splits them over ranks).
"""

from __future__ import annotations

import math

import torch

from optim.functional import (
    CLIP_SCOPES,
    check_betas,
    check_choice,
    check_common,
    clip_unit_norm_,
    mars_kappa,
    newton_schulz,
    resolve_dtype,
    rms_scale,
    shape_scale,
)
from optim.reference import ReferenceGradMixin

ALGORITHMS = ("muon", "mars-m", "mars-m-efficient")
SCALES = {"shape": shape_scale, "rms": rms_scale}


class MuonFamily(ReferenceGradMixin, torch.optim.Optimizer):
    """Groups with ``use_muon=True`` take the Muon-style update, the rest AdamW (see module)."""

    def __init__(self, groups: list[dict], *, is_approx: bool = True):
        groups = [g for g in groups if g["params"]]
        for g in groups:
            _check_group(g)
        super().__init__(groups, {})
        self.is_approx = is_approx
        self._reference_pending = False

    def _uses_reference(self, p: torch.Tensor, group: dict) -> bool:
        return _is_mars_m(group)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_reference()
        corrected = [self._corrections(g) if _is_mars_m(g) else None for g in self.param_groups]
        for scope in ("tensor", "global"):  # one global clip spans every group that asks for it
            pairs = zip(self.param_groups, corrected)
            cs = [c for g, w in pairs if w and g["clip"] == scope for c in w[1]]
            clip_unit_norm_(cs, scope)
        for group, work in zip(self.param_groups, corrected):
            if group["use_muon"]:
                self._muon_group(group, work)
            else:
                self._adamw_group(group)
        self._reference_pending = False
        return loss

    def _corrections(self, group: dict):
        """MARS-M's unclipped ``c`` for every matrix with a gradient."""
        params = [p for p in group["params"] if p.grad is not None]
        kappa = mars_kappa(group["gamma"], group["momentum"])
        cs = []
        for p in params:
            state = self.state[p]
            if "last_grad" not in state:
                plain = group["first_step"] == "plain"
                state["last_grad"] = p.grad.clone() if plain else torch.zeros_like(p)
            g = p.grad
            cs.append(g + kappa * (g - state["last_grad"]))
        return params, cs

    def _muon_group(self, group: dict, work) -> None:
        mu, lr, wd = group["momentum"], group["lr"], group["weight_decay"]
        algorithm = group["algorithm"]
        params, cs = work if work else ([p for p in group["params"] if p.grad is not None], None)
        for i, p in enumerate(params):
            g, state = p.grad, self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            buf = state["momentum_buffer"]
            if algorithm == "mars-m":
                buf.mul_(mu).add_(cs[i], alpha=1 - mu)
                u = buf
                self._advance_reference(state, g)
            elif algorithm == "mars-m-efficient":
                gamma = group["gamma"]
                buf.mul_(mu).add_(g, alpha=(1 - gamma) * (1 - mu) / mu)
                u = gamma * g + mu * buf
            else:
                buf.mul_(mu).add_(g)
                u = g + mu * buf if group["nesterov"] else buf
            dtype = resolve_dtype(group["ns_dtype"], p)
            o = newton_schulz(u.reshape(u.size(0), -1), group["ns_steps"], group["eps"], dtype)
            scale = SCALES[group["scale"]](o.shape)
            p.mul_(1 - lr * wd)
            p.add_(o.view_as(p).to(p.dtype), alpha=-lr * scale)

    def _adamw_group(self, group: dict) -> None:
        beta1, beta2 = group["betas"]
        lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
        for p in group["params"]:
            if p.grad is None:
                continue
            g, state = p.grad, self.state[p]
            if "step" not in state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            state["step"] += 1
            t = state["step"]
            m, v = state["exp_avg"], state["exp_avg_sq"]
            m.lerp_(g, 1 - beta1)
            v.lerp_(g * g, 1 - beta2)
            step_size = lr * math.sqrt(1 - beta2**t) / (1 - beta1**t)
            decay = step_size * wd if group["decay_bias_corrected"] else lr * wd
            p.mul_(1 - decay)
            p.addcdiv_(m, v.sqrt().add_(eps), value=-step_size)


def _is_mars_m(group: dict) -> bool:
    return group.get("use_muon", False) and group.get("algorithm") == "mars-m"


def _check_group(g: dict) -> None:
    check_common(g["lr"], g["eps"], g["weight_decay"], None if g["use_muon"] else g["betas"])
    if not g["use_muon"]:
        return
    check_choice(g["algorithm"], ALGORITHMS, "algorithm")
    check_choice(g["scale"], SCALES, "scale")
    check_choice(g["clip"], CLIP_SCOPES, "clip")
    check_choice(g["first_step"], ("zero", "plain"), "first_step")
    if not 0.0 <= g["momentum"] < 1.0 or (g["algorithm"] != "muon" and g["momentum"] == 0):
        raise ValueError(f"momentum must be in (0, 1), got {g['momentum']}")
    if g["gamma"] < 0:
        raise ValueError(f"gamma must be >= 0, got {g['gamma']}")
    if g["ns_steps"] < 1:
        raise ValueError(f"ns_steps must be >= 1, got {g['ns_steps']}")
    if g["algorithm"] == "mars-m-efficient" and g["clip"] != "none":
        raise ValueError("mars-m-efficient has no clipping: use clip='none' (or plain mars-m)")


def muon_group(params, *, lr, weight_decay, momentum=0.95, **options) -> dict:
    """A ``use_muon`` param group with every key the step reads (defaults: Muon's)."""
    group = dict(
        params=list(params),
        use_muon=True,
        lr=lr,
        weight_decay=weight_decay,
        momentum=momentum,
        algorithm="muon",
        nesterov=True,
        ns_steps=5,
        ns_dtype="bfloat16",
        eps=1e-7,
        scale="shape",
        gamma=0.0,
        clip="none",
        first_step="zero",
    )
    unknown = set(options) - set(group)
    if unknown:
        raise TypeError(f"unknown Muon group options {sorted(unknown)}")
    return {**group, **options}


def adamw_group(params, *, lr, weight_decay, betas=(0.9, 0.95), eps=1e-8, bias_corrected=False):
    """An AdamW backup param group."""
    check_betas(betas, "adamw_betas")
    return dict(
        params=list(params),
        use_muon=False,
        lr=lr,
        weight_decay=weight_decay,
        betas=tuple(betas),
        eps=eps,
        decay_bias_corrected=bias_corrected,
    )


class Muon(MuonFamily):
    """Muon (Nesterov momentum, NS5, scale sqrt(max(1, rows/cols))) plus an AdamW part.

    ``params`` go on Muon; ``adamw_params`` (optional) on AdamW with their own lr, betas, eps and
    weight decay. The defaults are the MARS repo's baseline: Muon wd 0, and its own AdamW, whose
    decay is multiplied by the bias-corrected step size (``adamw_decay_bias_corrected``).
    ``nesterov=False`` uses the momentum buffer (the MARS repo's version used the raw gradient).
    """

    def __init__(
        self,
        params,
        lr: float = 0.02,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        weight_decay: float = 0.0,
        *,
        adamw_params=None,
        adamw_lr: float = 3e-3,
        adamw_betas=(0.9, 0.95),
        adamw_eps: float = 1e-8,
        adamw_weight_decay: float = 0.1,
        adamw_decay_bias_corrected: bool = True,
        ns_dtype: str = "bfloat16",
    ):
        muon = muon_group(
            params,
            lr=lr,
            weight_decay=weight_decay,
            momentum=momentum,
            nesterov=nesterov,
            ns_steps=ns_steps,
            ns_dtype=ns_dtype,
        )
        adamw = adamw_group(
            adamw_params or [],
            lr=adamw_lr,
            weight_decay=adamw_weight_decay,
            betas=adamw_betas,
            eps=adamw_eps,
            bias_corrected=adamw_decay_bias_corrected,
        )
        super().__init__([muon, adamw])


class Moonlight(MuonFamily):
    """Moonlight's Muon (the MARS-M paper's baseline): Nesterov momentum, scale
    0.2*sqrt(max(A, B)), decay on everything, AdamW backup with the same lr and wd.
    Takes the official constructor's keywords."""

    def __init__(
        self,
        lr: float = 1e-3,
        wd: float = 0.1,
        muon_params=None,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        adamw_params=None,
        adamw_betas=(0.9, 0.95),
        adamw_eps: float = 1e-8,
        *,
        ns_dtype: str = "bfloat16",
    ):
        muon = muon_group(
            muon_params or [],
            lr=lr,
            weight_decay=wd,
            momentum=momentum,
            nesterov=nesterov,
            ns_steps=ns_steps,
            scale="rms",
            ns_dtype=ns_dtype,
        )
        adamw = adamw_group(
            adamw_params or [], lr=lr, weight_decay=wd, betas=adamw_betas, eps=adamw_eps
        )
        super().__init__([muon, adamw])


class MARS_M(MuonFamily):  # noqa: N801  (the official class name)
    """MARS-M: the MARS correction, clipped, in an EMA momentum in front of Moonlight's Muon.

    Takes the official constructor's keywords. Official bug not reproduced: ``clip_c`` was
    accepted and ignored (it always clipped). Here ``clip_c=True`` (the default, matching what the
    official runs did) clips each tensor's c to norm <= 1 and ``clip_c=False`` does not clip;
    ``clip`` ("tensor", "global", "none") overrides it when given.
    """

    def __init__(
        self,
        lr: float = 1e-3,
        wd: float = 0.1,
        muon_params=None,
        momentum: float = 0.95,
        ns_steps: int = 5,
        adamw_params=None,
        adamw_betas=(0.9, 0.95),
        adamw_eps: float = 1e-8,
        gamma: float = 0.025,
        clip_c: bool = True,
        is_approx: bool = True,
        *,
        clip: str | None = None,
        first_step: str = "zero",
        ns_dtype: str = "bfloat16",
    ):
        clip = clip if clip is not None else ("tensor" if clip_c else "none")
        muon = muon_group(
            muon_params or [],
            lr=lr,
            weight_decay=wd,
            momentum=momentum,
            algorithm="mars-m",
            nesterov=False,
            ns_steps=ns_steps,
            scale="rms",
            gamma=gamma,
            clip=clip,
            first_step=first_step,
            ns_dtype=ns_dtype,
        )
        adamw = adamw_group(
            adamw_params or [], lr=lr, weight_decay=wd, betas=adamw_betas, eps=adamw_eps
        )
        super().__init__([muon, adamw], is_approx=is_approx)


class MARS_M_Efficient(MuonFamily):  # noqa: N801  (the official class name)
    """MARS-M with one buffer per matrix: equal to approx MARS-M without clipping (no exact mode)."""

    def __init__(
        self,
        lr: float = 1e-3,
        wd: float = 0.1,
        muon_params=None,
        momentum: float = 0.95,
        ns_steps: int = 5,
        adamw_params=None,
        adamw_betas=(0.9, 0.95),
        adamw_eps: float = 1e-8,
        gamma: float = 0.025,
        *,
        ns_dtype: str = "bfloat16",
    ):
        muon = muon_group(
            muon_params or [],
            lr=lr,
            weight_decay=wd,
            momentum=momentum,
            algorithm="mars-m-efficient",
            nesterov=False,
            ns_steps=ns_steps,
            scale="rms",
            gamma=gamma,
            clip="none",
            ns_dtype=ns_dtype,
        )
        adamw = adamw_group(
            adamw_params or [], lr=lr, weight_decay=wd, betas=adamw_betas, eps=adamw_eps
        )
        super().__init__([muon, adamw])
