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
reference steps it with a zero gradient so that its all-gather stays in step). Under FSDP2
NorMuon refuses to run (use DDP).

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
        if is_sharded(p):
            raise ValueError("normuon does not run under FSDP (parallel=fsdp): its row "
                             "statistics need whole matrices; use DDP")  # fmt: skip
        state["second_momentum_buffer"] = p.new_zeros(p.shape[0], 1)

    def direction(self, states, us, cs, gs, *, beta1, foreach):
        # Batched by shape as Newton-Schulz is (``ns_batched``; False: the per-matrix loop)
        step = super().direction(states, us, cs, gs, beta1=beta1, foreach=foreach)
        seconds = [s["second_momentum_buffer"] for s in states]
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


def _scatter(out: Tensors, idx: list[int], stack: torch.Tensor) -> None:
    for i, t in zip(idx, stack.unbind(0)):
        out[i] = t
