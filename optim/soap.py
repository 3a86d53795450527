"""SOAP (Vyas et al. 2024, arXiv 2409.11321): Adam in the eigenbasis of Shampoo's preconditioner.

Reference: nikhilvyas/SOAP ``soap.py``. Per tensor, with its (optionally merged) dimensions
d_1..d_k, each dimension of size <= ``max_precond_dim`` keeps ``GG_i`` (Shampoo's L, R: an EMA of
the gradient's outer products over the other dimensions, rate ``shampoo_beta``, default beta2)
and ``Q_i`` (its eigenbasis). ``project(x)`` contracts each preconditioned dimension with Q_i
(``Q_i^T``), ``project_back`` with ``Q_i``; a dimension not preconditioned is left as it is.

    first step (t = 0):  GG_i = lerp(0, outer_i(c), 1 - shampoo_beta); Q_i = eigh(GG_i), no update
    each later step t:   m = beta1 * m + (1 - beta1) * c      (the core's EMA, original space)
                         v = beta2 * v + (1 - beta2) * project(c)^2
                         n = project_back(project(m) / (sqrt(v) + eps))
                         (``normalize_grads``: n = n / (1e-30 + rms(n)))
                         p = (p - lr * sqrt(1 - beta2^t) / (1 - beta1^t) * n) * (1 - lr * wd)
                         GG_i = lerp(GG_i, outer_i(c), 1 - shampoo_beta)
                         every ``precondition_frequency`` steps: sort Q_i's columns by the
                         estimated eigenvalues diag(Q_i^T GG_i Q_i) (v reordered to match), then
                         Q_i = qr(GG_i Q_i)   (one power iteration)

``c`` is the gradient for ``soap`` and the variance-reduced, clipped gradient for ``mars-soap``
(optim/core.py), as MARS's official Adam builds its second moment from c. Differences from the
reference, none of which changes the update in exact arithmetic:

- the reference keeps m in the eigenbasis and rotates it (back and forth) every step; here m
  stays in the original space and is projected when used: Q is orthogonal, so
  ``project(m)`` equals the reference's rotated m (tests/test_optim_soap.py, float64);
- the reference drops a float64 preconditioner to float32 for ``eigh`` and ``qr``; here the
  eigenbases are computed in float32 for float32/bfloat16 parameters and in float64 for
  float64 parameters (so the transcription test can run in float64);
- no ``data_format`` (no convolution layers here); GG_i and Q_i are tensors in the state under
  ``GG0``, ``Q0``, ``GG1``, ... (not lists), so checkpoints and the non-finite guard's staged
  copies (optim/masked.py) see every tensor.

Two paths, the same numbers: ``foreach`` (the core's default) batches the tensors of one shape
(optim/soap_batched.py: a few batched ops per shape, whatever the depth; GG_i, Q_i and
``exp_avg_sq`` each a slice of a per-shape stack, the state's keys and shapes unchanged);
``implementation="loop"`` is the loop below, one tensor at a time, the readable reference. On
a CPU they agree bit for bit in float64 except where a product is below torch's small-matrix
GEMM size (tests/test_batched_shapes.py).

Under FSDP2 (``fully_shard``) every tensor of SOAP's state is sharded by rows as its parameter
is (``exp_avg_sq`` as the parameter, ``GG_i`` and ``Q_i`` Shard(0) on the same mesh): each
rank holds and checkpoints its rows. Each parameter has an owner rank (optim/sharded.py
``owners``); per step one all-to-all brings the owner the whole ``m``, ``c``, ``exp_avg_sq``,
``GG_i`` and ``Q_i`` of every parameter it owns, the owner runs the step above on them (the
same code: batched or the loop), and one more sends every rank its rows of the direction and
of the new state (docs/fsdp-optimizers.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import chain

import torch
import torch.distributed as dist

from optim import sharded, soap_batched
from optim.options import validator
from optim.preconditioners import Options, Preconditioner, Step, register_preconditioner
from optim.sharded import is_sharded

Tensors = list[torch.Tensor]


@validator("shampoo_beta")
def _shampoo_beta(value, key):
    if not (value == -1 or 0.0 <= value < 1.0):
        raise ValueError(f"{key} must be in [0, 1) or -1 (use betas[1]), got {value}")


@validator("precondition_frequency", "max_precond_dim")
def _positive_int(value, key):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class SoapOptions(Options):
    eps: float = 1e-8
    shampoo_beta: float = -1.0  # -1: betas[1] (the reference's convention)
    precondition_frequency: int = 10
    max_precond_dim: int = 10000  # excludes GPT-2's vocabulary dimension, keeps the layers'
    merge_dims: bool = False  # merge dimensions while their product stays <= max_precond_dim
    precondition_1d: bool = False
    normalize_grads: bool = False
    correct_bias: bool = True


def merged_shape(shape: tuple[int, ...], max_dim: int) -> list[int]:
    """The reference's ``merge_dims``: neighbouring dimensions merged while their product is at
    most ``max_dim`` (a dimension above it stays alone)."""
    out, current = [], 1
    for size in shape:
        if current * size > max_dim:
            if current > 1:
                out.append(current)
                current = size
            else:
                out.append(size)
                current = 1
        else:
            current *= size
    if current > 1 or not out:
        out.append(current)
    return out


def work_shape(shape: tuple[int, ...], o: SoapOptions) -> list[int]:
    """The shape SOAP works on: merged (``merge_dims``, tensors of 2 or more dims) or as is."""
    return (
        merged_shape(shape, o.max_precond_dim) if o.merge_dims and len(shape) > 1 else list(shape)
    )


def preconditioned(ndim: int, shape: list[int], o: SoapOptions) -> list[bool]:
    """Which dimensions of the work shape get a GG_i and Q_i (``ndim``: the tensor's own; a
    1-D tensor only with ``precondition_1d``, a merged one whatever its work shape)."""
    if ndim == 1:
        return [o.precondition_1d and shape[0] <= o.max_precond_dim]
    return [size <= o.max_precond_dim for size in shape]


def project(x: torch.Tensor, qs: list, back: bool = False) -> torch.Tensor:
    """Contract each dimension with its Q (``Q^T x`` along it; ``back``: ``Q x``); a dimension
    without Q (None) is moved to the end unchanged, as the reference's permutation."""
    for q in qs:
        if q is None:
            x = x.permute(*range(1, x.ndim), 0)
        else:
            x = torch.tensordot(x, q, dims=[[0], [1 if back else 0]])
    return x


def outer(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``x`` contracted with itself over every dimension but ``dim`` (Shampoo's L or R term)."""
    others = [*chain(range(dim), range(dim + 1, x.ndim))]
    return torch.tensordot(x, x, dims=[others, others])


def eigenbasis(gg: torch.Tensor) -> torch.Tensor:
    """Eigenvectors of ``gg`` by decreasing eigenvalue (the reference's first basis)."""
    dtype = torch.float64 if gg.dtype == torch.float64 else torch.float32
    m = gg.to(dtype)
    _, q = torch.linalg.eigh(m + 1e-30 * torch.eye(m.shape[0], dtype=dtype, device=m.device))
    return torch.flip(q, [1]).to(gg.dtype)


@register_preconditioner("soap")
class Soap(Preconditioner):
    """SOAP's direction on the core's EMA momentum (module docstring)."""

    Options = SoapOptions
    whole_tensors = True  # under FSDP2 ``us`` come as DTensors: each owner's work is whole

    def init_state(self, p: torch.Tensor, state: dict) -> None:
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        shape = work_shape(tuple(p.shape), self.options)
        for i, (size, on) in enumerate(zip(shape, preconditioned(p.ndim, shape, self.options))):
            if on:  # Q_i is filled on the first step; zeros keep the key for staged copies
                if is_sharded(p):  # rows on every rank, as the parameter (module docstring)
                    state[f"GG{i}"] = sharded.sharded_zeros(p, (size, size))
                    state[f"Q{i}"] = sharded.sharded_zeros(p, (size, size))
                else:
                    state[f"GG{i}"] = p.new_zeros(size, size)
                    state[f"Q{i}"] = p.new_zeros(size, size)

    def direction(self, states, us, cs, gs, *, beta1, foreach):
        if any(is_sharded(u) for u in us):  # FSDP2: on the owners (module docstring)
            return self._direction_sharded(states, us, cs, beta1, foreach)
        # ``foreach``: batched by shape (optim/soap_batched.py); else this loop, the reference
        if foreach:
            return soap_batched.direction(self, states, us, cs, beta1)
        nums, sizes, keeps = [], [], []
        for state, m, c in zip(states, us, cs):
            num, size, keep = self.direction_of(state, m, c, beta1)
            nums.append(num)
            sizes.append(size)
            keeps.append(keep)
        return Step(nums, None, sizes, keeps)

    def _direction_sharded(self, states, us, cs, beta1: float, foreach: bool) -> Step:
        """``direction`` where ``us`` are DTensors (the rest local blocks, plain tensors whole):
        the plain ones as without FSDP, the sharded ones on their owners (``sharded.on_owners``:
        the owner gets every whole tensor of the step, runs ``direction`` on them, and the
        direction and the new state come back as rows). The step sizes are host numbers."""
        n = len(us)
        nums: Tensors = [None] * n  # type: ignore[list-item]
        sizes, keeps = [0.0] * n, [1.0] * n
        plain = [i for i, u in enumerate(us) if not is_sharded(u)]
        if plain:
            got = self.direction([states[i] for i in plain], [us[i] for i in plain],
                                 [cs[i] for i in plain], None, beta1=beta1, foreach=foreach)  # fmt: skip
            for k, i in enumerate(plain):
                nums[i], sizes[i], keeps[i] = got.nums[k], got.step_sizes[k], got.keeps[k]
        idx = [i for i, u in enumerate(us) if is_sharded(u)]
        shapes = [self._sharded_shapes(states[i], us[i]) for i in idx]
        keys = [list(s) for s in shapes]
        blocks = [[sharded.local(us[i]), cs[i], *(states[i][k] for k in ks)]
                  for i, ks in zip(idx, keys)]  # fmt: skip
        shapes = [[tuple(us[i].shape)] * 2 + list(s.values()) for i, s in zip(idx, shapes)]
        steps = [states[i]["step"] for i in idx]

        def fn(items: list[int], wholes: list[Tensors]) -> list[Tensors]:  # on the owner
            temps = [{"step": steps[j], **dict(zip(keys[j], w[2:]))}
                     for j, w in zip(items, wholes)]  # fmt: skip
            got = self.direction(temps, [w[0] for w in wholes], [w[1] for w in wholes], None,
                                 beta1=beta1, foreach=foreach)  # fmt: skip
            return [[num.reshape(shapes[j][0]), *(t[k] for k in keys[j])]
                    for j, num, t in zip(items, got.nums, temps)]  # fmt: skip

        results = sharded.on_owners(blocks, shapes, [s[:1] + s[2:] for s in shapes], fn,
                                    sharded.group_of([us[i] for i in idx]),
                                    [_cost(s[0]) for s in shapes])  # fmt: skip
        lr, wd = self.group["lr"], self.group["weight_decay"]
        for j, i in enumerate(idx):
            res = results[j]
            for k, t in zip(keys[j], res[1:]):
                states[i][k].copy_(t)
            nums[i] = res[0]
            if steps[j] == 1:  # the first step: the basis only; m not folded in (direction_of)
                sharded.local(us[i]).zero_()
            else:
                sizes[i] = self._step_size(steps[j] - 1, beta1) * (1 - lr * wd)
                keeps[i] = 1 - lr * wd
        return Step(nums, None, sizes, keeps)

    def _sharded_shapes(self, state: dict, u) -> dict[str, tuple]:
        """The global shape of each state tensor of the sharded parameter of momentum ``u``
        (``exp_avg_sq``, then ``GG_i``, ``Q_i``), each block checked to be this rank's rows."""
        shape = tuple(u.shape)
        out = {"exp_avg_sq": shape}
        for i, size in enumerate(self.shape_of(u)):
            if f"GG{i}" in state:
                out[f"GG{i}"] = out[f"Q{i}"] = (size, size)
        group = sharded.group_of([u])
        for key, s in out.items():
            start, stop = sharded.local_rows(s[0], dist.get_rank(group), group.size())
            if tuple(state[key].shape) != (stop - start, *s[1:]):
                raise ValueError(
                    f"soap's {key} holds {tuple(state[key].shape)} on this rank where the rows "
                    f"{start}:{stop} of {s} belong: load the optimizer state of a sharded "
                    "model with distributed checkpointing (or trainer.fsdp.rebuild_optimizer)"
                )
        return out

    def direction_of(self, state: dict, m: torch.Tensor, c: torch.Tensor, beta1: float):
        """One tensor's ``(num, step size, keep)``, its state updated (the loop's body)."""
        lr, wd = self.group["lr"], self.group["weight_decay"]
        if state["step"] == 1:  # the reference's first step: the basis only, no update
            self._update_basis(state, c, first=True)
            m.zero_()  # the reference does not fold the first gradient into m
            return torch.zeros_like(c), 0.0, 1.0
        num = self._normalized(state, m, c)
        size = self._step_size(state["step"] - 1, beta1) * (1 - lr * wd)
        self._update_basis(state, c, first=False)
        return num, size, 1 - lr * wd  # (p - s n)(1 - lr wd): the reference decays after

    def shape_of(self, x: torch.Tensor) -> list[int]:
        """The work shape of ``x`` (``work_shape``)."""
        return work_shape(tuple(x.shape), self.options)

    def _qs(self, state: dict, ndim: int) -> list:
        return [state.get(f"Q{i}") for i in range(ndim)]

    def _normalized(self, state: dict, m: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """``project_back(project(m) / (sqrt(v) + eps))`` after v's update (module docstring)."""
        o, beta2 = self.options, self.group["betas"][1]
        shape = work_shape(tuple(c.shape), o)
        qs = self._qs(state, len(shape))
        c_proj = project(c.reshape(shape), qs)
        v = state["exp_avg_sq"].view(shape)
        v.mul_(beta2).add_(c_proj.square(), alpha=1 - beta2)
        n = project(project(m.reshape(shape), qs) / (v.sqrt() + o.eps), qs, back=True)
        n = n.reshape(c.shape)
        if o.normalize_grads:
            n = n / (1e-30 + torch.mean(n**2) ** 0.5)
        return n

    def _step_size(self, t: int, beta1: float) -> float:
        lr, beta2 = self.group["lr"], self.group["betas"][1]
        if not self.options.correct_bias:
            return lr
        return lr * math.sqrt(1 - beta2**t) / (1 - beta1**t)

    def _update_basis(self, state: dict, c: torch.Tensor, *, first: bool) -> None:
        """GG_i's EMA, then Q_i: eigh on the first step, one power iteration and QR every
        ``precondition_frequency`` steps (reordering v by the estimated eigenvalues)."""
        o = self.options
        rate = 1 - (o.shampoo_beta if o.shampoo_beta >= 0 else self.group["betas"][1])
        shape = work_shape(tuple(c.shape), o)
        x = c.reshape(shape)
        on = [i for i in range(len(shape)) if f"GG{i}" in state]
        for i in on:
            state[f"GG{i}"].lerp_(outer(x, i), rate)
        if first:
            for i in on:
                state[f"Q{i}"].copy_(eigenbasis(state[f"GG{i}"]))
            return
        t = state["step"] - 1
        if t % o.precondition_frequency == 0:
            self._power_iteration(state, shape, on)

    @staticmethod
    def _power_iteration(state: dict, shape: list[int], on: list[int]) -> None:
        v = state["exp_avg_sq"].view(shape)
        dtype = torch.float64 if v.dtype == torch.float64 else torch.float32
        for i in on:
            gg, q = state[f"GG{i}"].to(dtype), state[f"Q{i}"].to(dtype)
            order = torch.argsort(torch.diag(q.T @ gg @ q), descending=True)
            v = v.index_select(i, order)
            q_new, _ = torch.linalg.qr(gg @ q[:, order])
            state[f"Q{i}"].copy_(q_new)
        state["exp_avg_sq"].copy_(v.reshape(state["exp_avg_sq"].shape))


def _cost(shape: tuple) -> tuple[int, int]:
    """The shape by which ``sharded.owners`` weighs a tensor's work (a vector: one row)."""
    return (1, shape[0]) if len(shape) == 1 else (shape[0], math.prod(shape[1:]))


# --- SOAP's options as config fields (SoapConfig in optim/plain.py, MarsSoapConfig in mars.py) ---


@dataclass
class SoapFields:
    """SOAP's options (nikhilvyas/SOAP ``soap.py`` defaults, the paper's recommended values)."""

    shampoo_beta: float = -1.0  # -1: betas[1]
    precondition_frequency: int = 10
    max_precond_dim: int = 10000
    merge_dims: bool = False
    precondition_1d: bool = False
    normalize_grads: bool = False
    correct_bias: bool = True
