"""The pieces every optimizer here is built from, as plain functions on tensors.

- ``mars_correction``: the variance-reduced gradient ``c = g + gamma*beta1/(1-beta1) * (g - g_ref)``
  (MARS, Yuan et al. 2025, Algorithm 1, line 5).
- ``clip_unit_norm_``: clip ``c`` to Frobenius norm <= 1 per tensor (official), over all tensors
  together (``global``, levanter's port) or not at all. Written without host synchronisation:
  ``c / max(1, ||c||)`` equals the official ``if ||c|| > 1: c = c / ||c||``.
- ``newton_schulz``: the quintic Newton-Schulz iteration that maps a matrix to the nearest
  semi-orthogonal one (Muon; coefficients 3.4445, -4.7750, 2.0315).
- ``shape_scale`` / ``rms_scale``: Muon's ``sqrt(max(1, rows/cols))`` and Moonlight's
  ``0.2*sqrt(max(rows, cols))`` update scales.
"""

from __future__ import annotations

import contextlib

import torch

from optim.options import CLIP_SCOPES

NS_COEFFS = (3.4445, -4.7750, 2.0315)


def mars_kappa(gamma: float, beta1: float) -> float:
    """The correction's scale ``gamma * beta1 / (1 - beta1)`` (0.475 at the defaults)."""
    return gamma * beta1 / (1.0 - beta1)


def mars_correct(g: torch.Tensor, g_ref: torch.Tensor, kappa) -> torch.Tensor:
    """``c = g + kappa * (g - g_ref)`` for one tensor, as a new tensor: the core's default
    ``correction`` (optim/core.py), which the loop, foreach and compiled paths all call.
    ``kappa`` is a float on the eager paths and a 0-d tensor in the compiled step."""
    return g + kappa * (g - g_ref)


def mars_correction(grads: list[torch.Tensor], refs: list[torch.Tensor], kappa: float):
    """``mars_correct`` over a list of tensors, as new tensors (foreach ops)."""
    if not grads:
        return []
    diff = torch._foreach_sub(grads, refs)
    return torch._foreach_add(grads, diff, alpha=kappa)


def clip_unit_norm_(tensors: list[torch.Tensor], scope: str) -> None:
    """Scale ``tensors`` in place so their norm is at most 1 (per tensor or jointly)."""
    if scope == "none" or not tensors:
        return
    norms = torch._foreach_norm(tensors)
    if scope == "tensor":
        torch._foreach_clamp_min_(norms, 1.0)
        torch._foreach_reciprocal_(norms)
        torch._foreach_mul_(tensors, norms)
    elif scope == "global":
        total = torch.linalg.vector_norm(torch.stack(norms)).clamp_min(1.0)
        torch._foreach_div_(tensors, total)
    else:
        raise ValueError(f"unknown clip scope {scope!r}; valid scopes: {list(CLIP_SCOPES)}")


def resolve_dtype(name: str, like: torch.Tensor) -> torch.dtype:
    """``"param"`` means the dtype of ``like``; otherwise a torch dtype name."""
    if name == "param":
        return like.dtype
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}; use 'param', 'bfloat16', 'float32', ...")
    return dtype


def newton_schulz(
    g: torch.Tensor,
    steps: int = 5,
    eps: float = 1e-7,
    dtype: torch.dtype = torch.bfloat16,
    *,
    fused: bool = False,
) -> torch.Tensor:
    """Approximately orthogonalise the last two dims of ``g`` (Muon's quintic iteration).

    ``X = g / (||g||_F + eps)`` (transposed when rows > cols); ``steps`` times
    ``A = X X^T; X = a X + (b A + c A^2) X`` with ``(a, b, c) = (3.4445, -4.7750, 2.0315)``.
    The result's singular values lie near 1 (roughly 0.7 to 1.2). Computed in ``dtype`` (bf16 as
    the official code) and returned in that dtype. ``fused``: each step's multiply-adds as
    two ``baddbmm`` calls (3 ops a step instead of 8, for GPU launch overhead); the products are
    accumulated in one rounding, so the result differs from the official arithmetic in the last
    bits (bf16: within its rounding; tests/test_newton_schulz.py).
    """
    if g.ndim < 2:
        raise ValueError(f"newton_schulz needs a matrix, got a tensor of shape {tuple(g.shape)}")
    x = g.to(dtype)
    transpose = g.size(-2) > g.size(-1)
    if transpose:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + eps)
    with full_float32(dtype):
        x = _iterate_fused(x, steps) if fused else _iterate(x, steps)
    return x.mT if transpose else x


def _iterate_fused(x: torch.Tensor, steps: int) -> torch.Tensor:
    """``_iterate`` with ``B = b A + c A A`` and ``X = a X + B X`` as ``baddbmm`` each."""
    a, b, c = NS_COEFFS
    batch = x.shape[:-2]
    x = x.reshape(-1, *x.shape[-2:])
    for _ in range(steps):
        A = torch.bmm(x, x.mT)
        B = torch.baddbmm(A, A, A, beta=b, alpha=c)
        x = torch.baddbmm(x, B, x, beta=a)
    return x.reshape(*batch, *x.shape[-2:])


def _iterate(x: torch.Tensor, steps: int) -> torch.Tensor:
    """``steps`` times ``A = X X^T; X = a X + (b A + c A^2) X``."""
    a, b, c = NS_COEFFS
    for _ in range(steps):
        A = x @ x.mT
        B = b * A + c * (A @ A)
        x = a * x + B @ x
    return x


@contextlib.contextmanager
def full_float32(dtype: torch.dtype):
    """float32 matmuls at full precision inside (``dtype`` float32), whatever the global setting.

    A run may allow TF32 globally (``torch.backends.cuda.matmul.allow_tf32`` or
    ``set_float32_matmul_precision("high")``) for its model; ``ns_dtype=float32`` still means
    float32 (other dtypes are not affected by the setting, so they leave it alone).
    """
    before = torch.get_float32_matmul_precision()
    if dtype != torch.float32 or before == "highest":
        yield
        return
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def shape_scale(shape: torch.Size) -> float:
    """Muon / MARS-Shampoo scale ``sqrt(max(1, rows/cols))`` of a (rows, cols) matrix."""
    return max(1.0, shape[0] / shape[1]) ** 0.5


def rms_scale(shape: torch.Size) -> float:
    """Moonlight / MARS-M scale ``0.2 * sqrt(max(A, B))``: matches AdamW's update RMS."""
    return 0.2 * max(shape[0], shape[1]) ** 0.5
