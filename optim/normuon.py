"""NorMuon (Li et al. 2025, arXiv 2510.05491): Muon with a per-row second moment.

Reference: zichongli5/NorMuon ``normuon.py`` (``normuon_update``, ``SingleDeviceNorMuon``). Per
hidden matrix (rows x cols), with mu the momentum:

    m = lerp(m, g, 1 - mu);  u = lerp(g, m, mu) (Nesterov) or m       (momentum form ema-nesterov)
    O = NS5(u)                                 (the Muon Newton-Schulz, optim/newton_schulz.py)
    s = lerp(s, mean(O*O, over cols), 1 - beta2)                        (s: rows x 1)
    O' = O / (sqrt(s) + 1e-10);  O' = O' * ||O||_F / (||O'||_F + 1e-10)  (norm kept)
    p = p * (1 - lr * wd) - lr * sqrt(max(1, rows/cols)) * O'

The other tensors (embeddings, head, gains) take the reference's auxiliary Adam:
``m = lerp(m, g, 1 - b1); v = lerp(v, g*g, 1 - b2); p = p * (1 - lr * wd) - lr * m_hat /
(sqrt(v_hat) + eps)`` with their own lr, betas, eps and wd.
Differences from the reference: the normalisation runs in the parameter's dtype (the reference
works on NS5's bfloat16 output); the gradient is not overwritten by the Nesterov lerp (the
reference writes ``u`` into ``p.grad``); a parameter without a gradient is skipped (the
reference steps it with a zero gradient so that its all-gather stays in step).

Under FSDP2 Newton-Schulz runs on owner ranks as Muon's does (optim/sharded.py) and its result
comes back as each rank's rows; the row second moment is a row statistic, so it lives sharded
with its rows (``second_momentum_buffer``: Shard(0), rows x 1, the same rows as the
parameter's) and is updated where the rows are, with no traffic. Only the kept norm needs the
whole matrix: ``||O||_F`` and ``||O'||_F`` are sums of squares of the rows, all-reduced, both of
every matrix in one call a step (``normalise_rows_sharded``).

The normalisation is batched by shape as Newton-Schulz is (``ns_batched``, default True):
``normalise_rows_batched`` works on Newton-Schulz's own per-shape stacks (no copy) and updates
every matrix's ``second_momentum_buffer`` (still one rows x 1 tensor per parameter) with foreach
ops: 6 ops per shape and 8 in all, whatever the depth, where the loop
(``normalise_rows``, ``ns_batched=False``) takes 13 per matrix. The same arithmetic element by
element: on a CPU the two agree bit for bit (tests/test_batched_shapes.py, float64).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from optim import sharded
from optim.momentum import MOMENTA, Momentum
from optim.options import validator
from optim.preconditioners import (
    NewtonSchulz,
    NewtonSchulzOptions,
    Step,
    register_preconditioner,
)
from optim.sharded import is_sharded
from optim.stacks import as_stack, same_shape

Tensors = list[torch.Tensor]

NORM_EPS = 1e-10  # the reference's, in both divisions


class EmaNesterov(Momentum):
    """Keller Jordan's current Muon momentum: ``m = lerp(m, g, 1 - mu)``; ``u = lerp(g, m, mu)``
    with the group's ``nesterov``, else ``m``."""

    key, beta_key = "momentum_buffer", "momentum"

    def update(self, group, states, cs, foreach):
        bufs, mu = [s[self.key] for s in states], group["momentum"]
        if foreach:
            torch._foreach_lerp_(bufs, cs, 1 - mu)
            return torch._foreach_lerp(cs, bufs, mu) if group["nesterov"] else bufs
        for b, g in zip(bufs, cs):
            b.lerp_(g, 1 - mu)
        return [torch.lerp(g, b, mu) for g, b in zip(cs, bufs)] if group["nesterov"] else bufs


if "ema-nesterov" not in MOMENTA:
    MOMENTA["ema-nesterov"] = EmaNesterov()


@validator("beta2")
def _beta2(value, key):
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{key} must be in [0, 1), got {value}")


@dataclass(frozen=True)
class NorMuonOptions(NewtonSchulzOptions):
    beta2: float = 0.95  # the per-row second moment's EMA rate


@register_preconditioner("normuon")
class NorMuon(NewtonSchulz):
    """Newton-Schulz, then each row divided by its second moment's root, norm kept (module)."""

    Options = NorMuonOptions

    def init_state(self, p: torch.Tensor, state: dict) -> None:
        if is_sharded(p):  # its rows where the parameter's are (module docstring)
            state["second_momentum_buffer"] = sharded.sharded_zeros(p, (p.shape[0], 1))
        else:
            state["second_momentum_buffer"] = p.new_zeros(p.shape[0], 1)

    def direction(self, states, us, cs, gs, *, beta1, foreach):
        # Batched by shape as Newton-Schulz is (``ns_batched``; False: the per-matrix loop)
        step = super().direction(states, us, cs, gs, beta1=beta1, foreach=foreach)
        seconds = [s["second_momentum_buffer"] for s in states]
        shards = [u if is_sharded(u) else None for u in us]
        if any(s is not None for s in shards):  # FSDP2: rows here, norms all-reduced
            nums = normalise_rows_sharded(seconds, [sharded.local(n) for n in step.nums],
                                          self.options.beta2, shards)  # fmt: skip
            return Step(nums, None, step.step_sizes, step.keeps)
        normalise = normalise_rows_batched if self.batched else normalise_rows
        nums = normalise(seconds, step.nums, self.options.beta2)
        return Step(nums, None, step.step_sizes, step.keeps)


def normalise_rows(seconds: Tensors, outs: Tensors, beta2: float) -> Tensors:
    """The reference's normalisation, one matrix at a time (the readable path): the row second
    moments ``seconds`` (rows x 1) updated in place, ``outs`` (NS5's results) normalised."""
    nums = []
    for second, o in zip(seconds, outs):
        norm = o.norm()
        second.lerp_(torch.mean(o * o, dim=-1, keepdim=True), 1 - beta2)
        o = o * (1 / second.sqrt().add_(NORM_EPS))
        nums.append(o.mul_(norm / (o.norm() + NORM_EPS)))
    return nums


def normalise_rows_batched(seconds: Tensors, outs: Tensors, beta2: float) -> Tensors:
    """``normalise_rows`` on per-shape stacks (Newton-Schulz's own where it left one: no copy),
    the per-matrix scalars and second moments through foreach ops over every matrix: 6 ops
    per shape and 8 in all, whatever the depth. The same arithmetic element by element (``1 / x``
    is ``reciprocal(x) * 1``; a norm is ``linalg_vector_norm`` per tensor on a CPU), so on a CPU
    it equals the loop bit for bit (tests/test_batched_shapes.py, float64)."""
    if not outs:
        return []
    groups = list(same_shape(outs).values())
    stacks = [as_stack([outs[i] for i in idx]) for idx in groups]
    norms = torch._foreach_norm(outs)
    means: Tensors = [None] * len(outs)  # type: ignore[list-item]
    for idx, o in zip(groups, stacks):
        _scatter(means, idx, torch.mean(o * o, dim=-1, keepdim=True))
    torch._foreach_lerp_(seconds, means, 1 - beta2)
    inverse = torch._foreach_sqrt(seconds)
    torch._foreach_add_(inverse, NORM_EPS)
    torch._foreach_reciprocal_(inverse)
    scaled = [o * torch.stack([inverse[i] for i in idx]) for idx, o in zip(groups, stacks)]
    nums: Tensors = [None] * len(outs)  # type: ignore[list-item]
    for idx, o in zip(groups, scaled):
        _scatter(nums, idx, o)
    after = torch._foreach_norm(nums)
    torch._foreach_add_(after, NORM_EPS)
    factors = torch._foreach_div(norms, after)
    for idx, o in zip(groups, scaled):
        o.mul_(torch.stack([factors[i] for i in idx]).view(-1, *[1] * (o.ndim - 1)))
    return nums


def normalise_rows_sharded(seconds: Tensors, outs: Tensors, beta2: float, shards: list) -> Tensors:
    """``normalise_rows`` where ``outs[i]`` are the rows this rank holds of matrix ``i`` (the
    DTensor ``shards[i]``; None: a whole plain matrix) and ``seconds[i]`` their second moments:
    each row's mean and division are the rows' own; the two Frobenius norms of every matrix
    are their rows' sums of squares, all-reduced in one call (module docstring)."""
    if not outs:
        return []
    dtype = torch.float64 if any(o.dtype == torch.float64 for o in outs) else torch.float32
    before = [o.to(dtype).square().sum() for o in outs]
    scaled = []
    for second, o in zip(seconds, outs):
        second.lerp_(torch.mean(o * o, dim=-1, keepdim=True), 1 - beta2)
        scaled.append(o * (1 / second.sqrt().add_(NORM_EPS)))
    after = [o.to(dtype).square().sum() for o in scaled]
    sq = torch.stack([*before, *after])
    idx = [i for i, s in enumerate(shards) if s is not None]
    part = torch.stack([sq[i] for i in idx] + [sq[len(outs) + i] for i in idx])
    dist.all_reduce(part, group=sharded.group_of(shards))
    sq = sq.clone()
    for k, i in enumerate(idx):
        sq[i], sq[len(outs) + i] = part[k], part[len(idx) + k]
    norms = sq.sqrt()
    return [o.mul_((norms[i] / (norms[len(outs) + i] + NORM_EPS)).to(o.dtype))
            for i, o in enumerate(scaled)]  # fmt: skip


def _scatter(out: Tensors, idx: list[int], stack: torch.Tensor) -> None:
    for i, t in zip(idx, stack.unbind(0)):
        out[i] = t
