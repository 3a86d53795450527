"""The compiled route: the core's element-wise chain as one ``torch.compile``d multi-tensor step.

For a bucket of the core (optim/core.py) whose rule is element-wise, one compiled call does, per
tensor and with no host synchronisation:

    c = correction(g, g_ref, kappa);  c = c / max(1, ||c||) (variance reduction, clip ``tensor``;
                                                            the optimizer's own correction)
    g_ref <- g                                             (approx mode; exact swaps buffers after)
    ema:  m = b1 * m + (1 - b1) * c;  u = m                 (``ema`` / ``ema-lerp`` momentum)
    lion: u = c + b1 * (m - c);  m = b2 * m + (1 - b2) * c
    adam: v = b2 * v + (1 - b2) * s*s (s = c or g);  v = max(v_max, v) with amsgrad
          d = u / ((sqrt(v) / a + eps) * b)                (both eps placements, see below)
    sign: d = sign(u)
    p = p * keep - size * d

Inductor fuses this into a norm pass (reads g, g_ref) and one update pass (reads p, g, g_ref, m,
v; writes p, m, v, g_ref). Hyperparameters travel as one tensor of per-tensor scalars, so a
schedule changing ``lr`` (or the step count of the bias corrections) reuses the compiled code.
Rules not covered (Newton-Schulz, heavy-ball / one-buffer momenta, the ``global`` clip) stay on
the foreach / per-tensor path. Equal to those paths up to rounding
(tests/test_optim_compiled.py). optim/routes.py decides which buckets take it.
"""

from __future__ import annotations

import functools
import logging
import math
import shutil

import torch

from optim.functional import mars_correct, mars_kappa
from optim.preconditioners import AdamOptions

log = logging.getLogger(__name__)
Tensors = list[torch.Tensor]

# columns of the per-tensor hyperparameter table
KAPPA, M_KEEP, M_ADD, U_LERP, V_KEEP, V_ADD, KEEP, SIZE, A, B, EPS = range(11)
MOMENTA = {"ema": "ema", "ema-lerp": "ema", "lion": "lion"}
PRECONDITIONERS = ("adam", "sign")


def covers(view: dict) -> bool:
    """Whether a bucket's rule (the group as ``route`` reads it) is covered by the compiled step."""
    vr = view.get("variance_reduction", False)
    return (
        view["momentum_form"] in MOMENTA
        and view["preconditioner"] in PRECONDITIONERS
        and not (vr and view.get("clip") not in ("tensor", "none"))
    )


@functools.cache
def unavailable_reason(device_type: str) -> str | None:
    """Why ``torch.compile`` (inductor) cannot run on this device type here, or None."""
    if not hasattr(torch, "compile"):
        return "this torch has no torch.compile"
    if device_type == "cuda":
        from torch.utils._triton import has_triton

        return None if has_triton() else "Triton is not installed (inductor needs it on CUDA)"
    if device_type == "cpu":
        try:
            from torch._inductor.cpp_builder import get_cpp_compiler

            compiler = get_cpp_compiler()
        except Exception as e:  # noqa: BLE001 (any failure means: no usable compiler)
            return f"inductor finds no C++ compiler ({e})"
        return None if shutil.which(compiler) else f"C++ compiler {compiler!r} not found"
    return f"device type {device_type!r} is not covered by the compiled step"


def _update(p, g, ref, m, v, vmax, h, *, reduce, clip, copy_ref, momentum, precond, src_c,
            skip=None, correction=mars_correct):  # fmt: skip
    """One tensor's step (module docstring); ``h`` is its row of the hyperparameter table.

    ``correction``: the optimizer's ``correction(g, g_ref, kappa)`` (optim/core.py), the same
    function the eager paths call, so a subclass's correction is compiled in, not replaced.

    ``skip``: None, or a 0-d bool tensor on the device (torch's ``found_inf``): where it is
    true every write keeps its old value, bit for bit, with no host read (the masks fuse into
    the same kernel)."""

    def write(dst, new):
        dst.copy_(new if skip is None else torch.where(skip, dst, new))

    c = g
    if reduce:
        c = correction(g, ref, h[KAPPA])
        if clip:
            c = c / torch.linalg.vector_norm(c).clamp_min(1.0)
        if copy_ref:
            write(ref, g)
    if momentum == "lion":
        u = c + h[U_LERP] * (m - c)
        write(m, m * h[M_KEEP] + c * h[M_ADD])
    else:
        write(m, m * h[M_KEEP] + c * h[M_ADD])
        u = m
    if precond == "adam":
        s = c if src_c else g
        write(v, v * h[V_KEEP] + s * s * h[V_ADD])
        if vmax is not None:
            write(vmax, torch.maximum(vmax, v))
            v = vmax
        d = u / ((v.sqrt() / h[A] + h[EPS]) * h[B])
    else:
        d = torch.sign(u)
    write(p, p * h[KEEP] - h[SIZE] * d)


def _multi_step(params, grads, refs, ms, vs, vmaxs, table, **flags) -> None:
    for i in range(len(params)):
        _update(params[i], grads[i], refs[i] if refs else None, ms[i], vs[i] if vs else None,
                vmaxs[i] if vmaxs else None, table[i], **flags)  # fmt: skip


# How a bucket is compiled, by device type (bench/optim_fused.py measures both):
# "tensor": one compiled per-tensor step with dynamic shapes, called per tensor (compiles once
# per rank and rule: seconds; the calls cost tens of microseconds each, nothing beside a CPU
# step); "list": one compiled step over the bucket's tensors (no per-tensor calls, for GPU
# launch overhead, but on a CPU the compile grows by seconds per tensor: minutes for GPT-2).
# "list" calls the compiled step once per chunk of at most CHUNK same-shape tensors (shape_chunks).
GROUPING = {"cpu": "tensor", "cuda": "list"}
CHUNK = 16
_COMPILED: dict = {}


def _compiled(grouping: str):
    if grouping not in _COMPILED:
        fn, dynamic = (_update, True) if grouping == "tensor" else (_multi_step, False)
        _COMPILED[grouping] = torch.compile(fn, fullgraph=True, dynamic=dynamic)
    return _COMPILED[grouping]


def _dynamo_config():
    """torch._dynamo's config module (a function, so a test can stand in an older one)."""
    return torch._dynamo.config


def compile_settings():
    """The dynamo settings the compiled step needs, under the names this torch has.

    Parameters keep dynamic shapes (else every shape is a recompile) where the option exists,
    and the recompile limit is raised: ``recompile_limit`` (torch >= 2.6), ``cache_size_limit``
    before. Raises (caught by ``_run``: a logged fallback) if the config cannot be patched.
    """
    config = _dynamo_config()
    options = {}
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name):
            options[name] = 64
            break
    if hasattr(config, "force_parameter_static_shapes"):
        options["force_parameter_static_shapes"] = False
    return config.patch(**options)


def _run(grouping: str, args: tuple, flags: dict, may_fall_back: bool) -> str | None:
    """Run the compiled step; if it fails to compile (nothing ran), run it eagerly instead."""
    try:
        settings = compile_settings()
    except Exception as e:  # noqa: BLE001 (an unknown torch: fall back, never fail the step)
        if not may_fall_back:
            raise
        _multi_step(*args, **flags)
        return f"dynamo settings unavailable ({type(e).__name__}: {e})"
    params, grads, refs, ms, vs, vmaxs, table = args
    with settings:
        if grouping == "list":
            try:
                _compiled("list")(*args, **flags)
                return None
            except Exception as e:  # noqa: BLE001 (compile failed before anything ran)
                if not may_fall_back:
                    raise
                _multi_step(*args, **flags)
                return f"{type(e).__name__}: {e}"
        for i in range(len(params)):
            row = (params[i], grads[i], refs[i] if refs else None, ms[i], vs[i] if vs else None,
                   vmaxs[i] if vmaxs else None, table[i])  # fmt: skip
            try:
                _compiled("tensor")(*row, **flags)
            except Exception as e:  # noqa: BLE001 (tensors before i are done: finish eagerly)
                if not may_fall_back:
                    raise
                _multi_step(*(a[i:] for a in args), **flags)
                return f"{type(e).__name__}: {e}"
    return None


def hyper_table(view: dict, steps: list[int], beta: float, kappa: float, momentum: str) -> list:
    """Per-tensor rows of scalars (host floats: no synchronisation) for ``_update``."""
    lr, wd = view["lr"], view["weight_decay"]
    b2 = view["betas"][1] if "betas" in view else 0.0
    adam = AdamOptions.from_group(view) if view["preconditioner"] == "adam" else None
    eps = adam.eps if adam else 0.0
    if momentum == "lion":
        m_keep, m_add, u_lerp = b2, 1.0 - b2, beta
    else:
        m_keep, m_add, u_lerp = beta, 1.0 - beta, 0.0
    rows = []
    for t in steps:
        keep, size, a, b = 1.0 - lr * wd, lr, 1.0, 1.0
        if adam and t:
            if adam.eps_placement == "after_sqrt_v_hat":
                a, b = math.sqrt(1 - b2**t), 1 - beta**t
            else:
                size = lr * math.sqrt(1 - b2**t) / (1 - beta**t)
                if adam.decay_bias_corrected:
                    keep = 1.0 - size * wd
        rows.append([kappa, m_keep, m_add, u_lerp, b2, 1.0 - b2, keep, size, a, b, eps])
    return rows


def step(bucket, *, is_approx: bool, may_fall_back: bool = True,
               skip: torch.Tensor | None = None, correction=mars_correct) -> str | None:  # fmt: skip
    """Run one bucket of the core (optim/core.py ``Bucket``) through the compiled step.

    The caller has counted the steps; in exact mode it swaps the reference buffers afterwards.
    ``skip`` (a 0-d bool tensor on the device, or None): where true, nothing is written.
    ``correction``: the optimizer's per-tensor correction (compiled into the step).
    Returns None, or why it could not compile (``may_fall_back``: the step was then done eagerly
    by the same code; otherwise the error propagates).
    """
    view, states, params = bucket.view, bucket.states, bucket.params
    momentum = MOMENTA[view["momentum_form"]]
    beta = bucket.momentum.beta(view)
    reduce = bool(view.get("variance_reduction", False))
    kappa = mars_kappa(view["gamma"], beta) if reduce else 0.0
    steps = [s["step"] for s in states]
    dtype = torch.promote_types(params[0].dtype, torch.float32)
    cuda = params[0].is_cuda  # pinned (torch's caching host allocator): an async copy, no sync
    rows = hyper_table(view, steps, beta, kappa, momentum)
    adam = view["preconditioner"] == "adam"
    options = AdamOptions.from_group(view) if adam else None
    amsgrad = adam and options.amsgrad
    flags = dict(
        reduce=reduce,
        clip=reduce and view.get("clip") == "tensor",
        copy_ref=reduce and is_approx,
        momentum=momentum,
        precond=view["preconditioner"],
        src_c=not adam or options.second_moment == "c",
    )
    if skip is not None:  # absent otherwise: the compiled code is the one without masks
        flags["skip"] = skip
    if reduce and correction is not mars_correct:  # absent otherwise: the default's graph
        flags["correction"] = correction
    lists = (
        params,
        bucket.gs,
        [s["last_grad"] for s in states] if reduce else [],
        [s[bucket.momentum.key] for s in states],
        [s["exp_avg_sq"] for s in states] if adam else [],
        [s["max_exp_avg_sq"] for s in states] if amsgrad else [],
    )
    grouping = GROUPING.get(params[0].device.type, "list")
    chunks = shape_chunks(params) if grouping == "list" else [list(range(len(params)))]
    for k, idx in enumerate(chunks):
        sub = [[a[i] for i in idx] if a else [] for a in lists]
        table = torch.tensor([rows[i] for i in idx], dtype=dtype, pin_memory=cuda)
        args = (*sub, table.to(params[0].device, non_blocking=True))
        why = _run(grouping, args, flags, may_fall_back)
        if why is not None:  # this chunk ran eagerly; so do the rest (no second failed compile)
            for rest in chunks[k + 1 :]:
                sub = [[a[i] for i in rest] if a else [] for a in lists]
                table = torch.tensor([rows[i] for i in rest], dtype=dtype, device=params[0].device)
                _multi_step(*sub, table, **flags)
            return why
    return None


def shape_chunks(params: Tensors, size: int = CHUNK) -> list[list[int]]:
    """Indices of ``params`` in chunks of at most ``size`` tensors of one shape, for the "list"
    grouping: each distinct (shape, length) is one compiled graph, so the compile does not grow
    with depth (GPT-2 XL compiles the graphs GPT-2 small does), and no graph is so large that
    inductor takes minutes over it (GPT-2 small's 75 tensors as one list took over a minute)."""
    by_shape: dict[tuple, list[int]] = {}
    for i, p in enumerate(params):
        by_shape.setdefault((tuple(p.shape), p.dtype), []).append(i)
    return [idx[k : k + size] for idx in by_shape.values() for k in range(0, len(idx), size)]


def same_device_and_dtype(params: Tensors) -> bool:
    first = params[0]
    return all(p.device == first.device and p.dtype == first.dtype for p in params)


def signature(bucket, correction=mars_correct) -> tuple:
    """What the compiled code depends on: the rule, the correction function and the tensors'
    shapes, dtype and device."""
    view, p = bucket.view, bucket.params[0]
    rule = tuple(view.get(k) for k in ("momentum_form", "preconditioner", "variance_reduction",
                                       "clip", "amsgrad", "second_moment"))  # fmt: skip
    return rule, correction, tuple(q.shape for q in bucket.params), p.dtype, p.device
