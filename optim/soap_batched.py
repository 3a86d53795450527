"""SOAP's direction on per-shape stacks: the fast path (``foreach``) of optim/soap.py, whose
loop (``implementation="loop"``) stays the readable reference.

The tensors of one call that share a work shape, the set of preconditioned dimensions, dtype,
device and what this step does to them (the first step's basis, a power iteration, neither) are
one batch: each projection, second-moment update, outer product, GG_i EMA, ``eigh`` and ``qr`` is
one batched op for the batch (``torch.bmm`` on ``(k, rows, cols)`` stacks, batched
``torch.linalg.eigh``/``qr``) instead of one per tensor, so a step's launches no longer grow
with depth (docs/optim-engine.md). The state keeps its layout: ``GG_i``, ``Q_i`` and
``exp_avg_sq`` stay one tensor per parameter, each a slice of its batch's stack
(optim/stacks.py ``adopt``: made on the first step, found and not copied on later ones).

Arithmetic. Each batched GEMM takes its operands in the layouts the loop's ``tensordot`` gives
them, so on a CPU a slice runs the same GEMM as the loop and the two agree bit for bit, except
where a product is below torch's small-matrix size (rows * cols * inner < 400, where ``bmm``
sums in its own loop: last-bit differences, about 1e-15 relative after 20 steps in float64).
Batched ``eigh`` and ``qr`` run the per-matrix LAPACK calls on a CPU; on CUDA torch may choose a
batched solver for small matrices (Jacobi ``eigh``), equal up to rounding and the eigenvectors'
signs, which SOAP's update does not depend on (tests/test_batched_shapes.py).

Two exceptions. A rotated vector (a 1-D tensor with ``precondition_1d``, or one ``merge_dims``
makes 1-D) is stepped alone by the loop's code: its GG, a sum of ``c c^T``, is rank-deficient
for as many steps as it is long, so its eigenbasis and SOAP's update are fixed only up to
rounding, and only the reference's own arithmetic follows the reference there (with
``precondition_1d``, off by default, a model's gains and biases step one by one). And a batch
is at most ``BATCH_BYTES`` in its largest temporary (a ``(k, d, d)`` outer product or power
iteration, a ``(k, rows, cols)`` projection), bounding the step's extra memory: GPT-2 small's
shapes are one batch each, GPT-2 XL's 6400-wide factors batches of 6.
"""

from __future__ import annotations

import math
from itertools import chain

import torch

from optim.preconditioners import Step
from optim.stacks import adopt, as_stack

Tensors = list[torch.Tensor]
BATCH_BYTES = 1 << 30


def direction(pre, states: list[dict], us: Tensors, cs: Tensors, beta1: float) -> Step:
    """``Soap.direction`` on batches (module docstring): the same Step, the same state updates."""
    lr, wd = pre.group["lr"], pre.group["weight_decay"]
    n = len(states)
    nums: Tensors = [None] * n  # type: ignore[list-item]
    sizes, keeps = [0.0] * n, [1.0] * n
    alone, groups = batches(pre, states, cs)
    for i in alone:
        nums[i], sizes[i], keeps[i] = pre.direction_of(states[i], us[i], cs[i], beta1)
    first = [i for idx in groups for i in idx if states[i]["step"] == 1]
    if first:  # the reference does not fold the first gradient into m
        torch._foreach_zero_([us[i] for i in first])
    for idx in groups:
        c0, state0 = cs[idx[0]], states[idx[0]]
        shape = pre.shape_of(c0)
        on = [d for d in range(len(shape)) if f"GG{d}" in state0]
        sub = [states[i] for i in idx]
        c = as_stack([cs[i].reshape(shape) for i in idx])
        gg = {d: adopt(sub, f"GG{d}") for d in on}
        q = {d: adopt(sub, f"Q{d}") for d in on}
        v = adopt(sub, "exp_avg_sq").view(len(idx), *shape)  # made on the first step
        if state0["step"] == 1:
            _update_gg(pre, c, gg)
            for d in on:
                q[d].copy_(eigenbases(gg[d]))
            out = torch.zeros((len(idx), *c0.shape), dtype=c0.dtype, device=c0.device)
            _scatter(nums, idx, out)
            continue
        m = as_stack([us[i].reshape(shape) for i in idx])
        _scatter(nums, idx, _normalized(pre, v, m, c, [q.get(d) for d in range(len(shape))],
                                        c0.shape))  # fmt: skip
        for i in idx:
            sizes[i] = pre._step_size(states[i]["step"] - 1, beta1) * (1 - lr * wd)
            keeps[i] = 1 - lr * wd  # (p - s n)(1 - lr wd): the reference decays after
        _update_gg(pre, c, gg)
        if gg and _power_step(pre, state0):
            _power_iteration(v, gg, q)
    return Step(nums, None, sizes, keeps)


def batches(pre, states: list[dict], cs: Tensors) -> tuple[list[int], list[list[int]]]:
    """The tensors stepped alone (a rotated vector: module docstring), and the indices of those
    that share a batch, each at most ``BATCH_BYTES`` in its largest temporary."""
    alone, groups = [], {}
    for i, (s, c) in enumerate(zip(states, cs)):
        shape = tuple(pre.shape_of(c))
        on = tuple(f"GG{d}" in s for d in range(len(shape)))
        if len(shape) == 1 and on[0]:
            alone.append(i)
            continue
        stage = s["step"] == 1, s["step"] > 1 and _power_step(pre, s)
        groups.setdefault((shape, on, c.dtype, c.device, stage), []).append(i)
    out = []
    for (shape, on, dtype, _, _), idx in groups.items():
        dims = [size * size for size, p in zip(shape, on) if p]
        width = max(torch.finfo(dtype).bits, 32) // 8  # eigh and QR run in float32 at least
        k = max(1, BATCH_BYTES // (width * max([math.prod(shape), *dims])))
        out += [idx[j : j + k] for j in range(0, len(idx), k)]
    return alone, out


def _power_step(pre, state: dict) -> bool:
    return (state["step"] - 1) % pre.options.precondition_frequency == 0


def _scatter(out: Tensors, idx: list[int], stack: torch.Tensor) -> None:
    for i, t in zip(idx, stack.unbind(0)):
        out[i] = t


def project(x: torch.Tensor, qs: list, back: bool = False) -> torch.Tensor:
    """``soap.project`` on a ``(k, ...)`` stack: per dimension one ``bmm`` of ``(k, rest, d)``
    by ``Q`` (``Q^T`` with ``back``), the operands laid out as ``tensordot`` lays them out."""
    for q in qs:
        if q is None:
            x = x.permute(0, *range(2, x.ndim), 1)
            continue
        k, d, rest = x.shape[0], x.shape[1], x.shape[2:]
        flat = x if x.ndim == 3 else x.reshape(k, d, -1)
        x = torch.bmm(flat.mT, q.mT if back else q).view(k, *rest, d)
    return x


def outer(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``soap.outer`` on a ``(k, ...)`` stack: ``(k, d, d)`` for work dimension ``dim``."""
    k, others = x.shape[0], [*chain(range(1, dim + 1), range(dim + 2, x.ndim))]
    a = x.permute(0, dim + 1, *others)
    if a.ndim != 3:
        a = a.reshape(k, x.shape[dim + 1], -1)
    return torch.bmm(a, a.mT)


def eigenbases(gg: torch.Tensor) -> torch.Tensor:
    """``soap.eigenbasis`` of each matrix of a ``(k, d, d)`` stack (one batched ``eigh``)."""
    dtype = torch.float64 if gg.dtype == torch.float64 else torch.float32
    m = gg.to(dtype)
    eye = torch.eye(m.shape[-1], dtype=dtype, device=m.device)
    _, q = torch.linalg.eigh(m + 1e-30 * eye)
    return torch.flip(q, [-1]).to(gg.dtype)


def _normalized(pre, v, m, c, qs, shape) -> torch.Tensor:
    """``Soap._normalized`` on stacks: v (a view of the states) updated in place; the
    directions as a ``(k, *shape)`` stack."""
    o, beta2 = pre.options, pre.group["betas"][1]
    v.mul_(beta2).add_(project(c, qs).square(), alpha=1 - beta2)
    n = project(project(m, qs) / (v.sqrt() + o.eps), qs, back=True)
    if tuple(n.shape[1:]) != tuple(shape):
        n = n.reshape(len(n), *shape)
    if o.normalize_grads:
        dims = tuple(range(1, n.ndim))
        n = n / (1e-30 + torch.mean(n**2, dim=dims, keepdim=True) ** 0.5)
    return n


def _update_gg(pre, c: torch.Tensor, gg: dict) -> None:
    o = pre.options
    rate = 1 - (o.shampoo_beta if o.shampoo_beta >= 0 else pre.group["betas"][1])
    for d, stack in gg.items():
        stack.lerp_(outer(c, d), rate)


def _power_iteration(v: torch.Tensor, gg: dict, q: dict) -> None:
    """``Soap._power_iteration`` on stacks: per dimension, sort by the estimated eigenvalues
    (``v`` reordered to match), then ``Q = qr(GG Q)``."""
    dtype = torch.float64 if v.dtype == torch.float64 else torch.float32
    new = v
    for d, stack in gg.items():
        g, b = stack.to(dtype), q[d].to(dtype)
        order = torch.argsort(torch.diagonal(b.mT @ g @ b, dim1=-2, dim2=-1), descending=True)
        index = order.view(len(order), *[1] * d, -1, *[1] * (v.ndim - d - 2))
        new = torch.take_along_dim(new, index, dim=d + 1)
        q_new, _ = torch.linalg.qr(g @ torch.take_along_dim(b, order[:, None, :], dim=2))
        q[d].copy_(q_new)
    v.copy_(new)
