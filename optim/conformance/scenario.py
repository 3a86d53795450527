"""The fixed problem every conformance vector is run on: tensors, seeded gradients, lr schedule.

The tensors are named as in GPT-2 so that each optimizer's official routing applies to them: two
block matrices (one tall, one wide), the tied token embedding ``wte.weight`` (2-D, but on the
AdamW backup of MARS-M and Moonlight, and on Muon in the MARS repo's Muon baseline), a LayerNorm
gain and a bias. Gradients do not depend on the weights (they are data of the vector), so an
error in one step does not feed back into the next step's gradient.

Each tensor's gradient has a Frobenius norm drawn log-uniformly from ``GRAD_NORMS``: with the
MARS factor ``kappa = 0.475`` the corrected ``c`` has a norm above 1 on some steps and below 1
on others, so the per-tensor clip triggers on some steps only (the manifest lists which).
Exact mode also needs the look-ahead gradient ``g(x_t, batch t+1)`` computed before step t: here
the next step's gradient plus a smaller perturbation (the weights moved a little).
"""

from __future__ import annotations

import math

import torch

TENSORS = {  # name -> shape, in the model's named_parameters order
    "wte.weight": (24, 6),
    "h.0.ln_1.weight": (6,),
    "h.0.mlp.c_fc.weight": (16, 6),
    "h.0.mlp.c_fc.bias": (16,),
    "h.0.mlp.c_proj.weight": (6, 16),
}
STEPS = 12
SEED = 20250
GRAD_NORMS = (0.15, 1.2)
LOOKAHEAD_NOISE = 0.3  # ||g_ref(t+1) - g(t+1)|| relative to ||g(t+1)||
WARMUP_ITERS = 3


def initial_params(seed: int = SEED) -> dict[str, torch.Tensor]:
    """The starting weights (float64)."""
    gen = torch.Generator().manual_seed(seed)
    return {n: 0.5 * torch.randn(s, generator=gen, dtype=torch.float64) for n, s in TENSORS.items()}


def gradients(seed: int = SEED, steps: int = STEPS) -> tuple[dict, dict]:
    """``(grads, refs)``: per tensor a ``(steps, *shape)`` float64 stack of the step gradients and
    of the exact-mode look-ahead gradients (``refs[t]`` is computed before step t and is the
    reference of step t+1)."""
    gen = torch.Generator().manual_seed(seed + 1)
    lo, hi = math.log(GRAD_NORMS[0]), math.log(GRAD_NORMS[1])
    grads, refs = {}, {}
    for name, shape in TENSORS.items():
        raw = torch.randn((steps + 1, *shape), generator=gen, dtype=torch.float64)
        u = torch.rand(steps + 1, generator=gen, dtype=torch.float64)
        norms = torch.exp(lo + (hi - lo) * u)
        g = raw / _norms(raw) * norms.view(-1, *[1] * len(shape))
        noise = torch.randn((steps, *shape), generator=gen, dtype=torch.float64)
        noise = noise / _norms(noise) * (LOOKAHEAD_NOISE * norms[1:]).view(-1, *[1] * len(shape))
        grads[name] = g[:steps].contiguous()
        refs[name] = (g[1:] + noise).contiguous()
    return grads, refs


def _norms(x: torch.Tensor) -> torch.Tensor:
    return x.flatten(1).norm(dim=1).view(-1, *[1] * (x.ndim - 1))


def official_lr(it: int, *, base_lr: float, min_lr: float, steps: int = STEPS) -> float:
    """The official training scripts' ``get_lr``: linear warmup from 0, then cosine to ``min_lr``
    (``lr_decay_iters`` = the number of steps). Iteration 0 has lr 0, as in the official runs."""
    if it < WARMUP_ITERS:
        return base_lr * it / WARMUP_ITERS
    ratio = (it - WARMUP_ITERS) / (steps - WARMUP_ITERS)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (base_lr - min_lr)


def clipped_steps(grads: torch.Tensor, refs: torch.Tensor | None, kappa: float) -> list[int]:
    """The (1-based) steps at which ``||g + kappa (g - g_ref)|| > 1`` for one tensor, with
    ``g_ref`` the previous gradient (approx, ``refs`` None) or the previous look-ahead (exact);
    zero at step 1."""
    out = []
    for t in range(grads.shape[0]):
        prev = torch.zeros_like(grads[t]) if t == 0 else (grads if refs is None else refs)[t - 1]
        if (grads[t] + kappa * (grads[t] - prev)).norm() > 1:
            out.append(t + 1)
    return out
