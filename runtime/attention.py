"""Which kernel runs ``F.scaled_dot_product_attention`` in training: chosen by measurement.

``sdpa_backend`` (trainer/config.py) is one of :data:`SDPA_BACKENDS`:

- ``auto`` (the default): on CUDA, each of the flash, cuDNN and memory-efficient kernels runs
  the run's attention (its micro-batch, heads, sequence length, head size, dtype, causal mask)
  forward and backward; a kernel whose output and gradients differ from a float32 reference by
  more than bf16 noise (:data:`AGREE_RTOL`, relative to the flash kernel's own error) or that
  cannot run these shapes is left out, and the fastest of the rest is the only one left on,
  process-wide (torch's ``torch.backends.cuda.enable_*_sdp`` switches, read when attention is
  traced or dispatched). Several processes take rank 0's choice. Elsewhere (CPU, MPS) nothing
  changes: torch's CPU kernels have no choice worth measuring.
- ``torch``: torch's own order and switches, as the process found them.
- ``flash``, ``cudnn``, ``efficient``, ``math``: only that kernel, on CUDA (a CPU run logs that
  the setting applies to CUDA only and keeps torch's order).

The choice and every kernel's time are logged and kept in the run's ``meta.jsonl``
(``sdpa``); ``python -m bench.train --sdpa-backend NAME`` measures whole training steps with
each. The math of the model does not change: every kernel computes the same attention.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

SDPA_BACKENDS = ("auto", "torch", "flash", "cudnn", "efficient", "math")
KERNELS = ("flash", "cudnn", "efficient")  # the candidates of ``auto``, in torch's names below
# A kernel agrees when its relative error against the float32 math reference (output and each
# gradient, ||x - ref|| / ||ref||) is at most max(AGREE_RTOL, 2 x the flash kernel's own error):
# bf16 keeps 8 bits of mantissa (relative rounding 2^-9 = 0.002 per element).
AGREE_RTOL = 0.01
CHECK_BATCH = 2  # sequences of the agreement check (its fp32 reference holds T x T scores)


# torch's own switches as this process found them (``torch``: back to these).
TORCH_DEFAULTS = {
    "flash": torch.backends.cuda.flash_sdp_enabled(),
    "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
    "efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
    "math": torch.backends.cuda.math_sdp_enabled(),
}


def _sdpa_backend_enum(name: str) -> Any:
    from torch.nn.attention import SDPBackend

    return {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }[name]


def check_sdpa_backend(name: str) -> None:
    if name not in SDPA_BACKENDS:
        raise ValueError(
            f"unknown sdpa_backend {name!r}; valid: {list(SDPA_BACKENDS)} (auto: the fastest "
            "kernel that agrees with a float32 reference, measured at the run's shapes on CUDA)"
        )


def set_sdpa_backend(name: str) -> None:
    """Only ``name``'s kernel on, process-wide; ``torch`` (or ``auto``) restores torch's order."""
    check_sdpa_backend(name)
    if name in ("torch", "auto"):
        flags = dict(TORCH_DEFAULTS)
    else:
        flags = {k: k == name for k in ("flash", "cudnn", "efficient", "math")}
    torch.backends.cuda.enable_flash_sdp(flags["flash"])
    torch.backends.cuda.enable_cudnn_sdp(flags["cudnn"])
    torch.backends.cuda.enable_mem_efficient_sdp(flags["efficient"])
    torch.backends.cuda.enable_math_sdp(flags["math"])


@dataclass(frozen=True)
class AttentionShape:
    """One attention call of a run: (batch, heads, tokens, head size), dtype, dropout."""

    batch: int
    heads: int
    tokens: int
    head_dim: int
    dtype: torch.dtype
    dropout: float = 0.0

    @classmethod
    def of_run(cls, model_cfg: Any, micro_batch: int, seq_len: int, dtype: torch.dtype):
        n_head = model_cfg.n_head
        return cls(micro_batch, n_head, seq_len, model_cfg.n_embd // n_head, dtype,
                   float(getattr(model_cfg, "dropout", 0.0)))  # fmt: skip


def _qkv(shape: AttentionShape, batch: int, device: torch.device, dtype: torch.dtype, seed: int):
    """q, k, v laid out as the model's (a (B, T, 3C) projection split, viewed, transposed)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    c = shape.heads * shape.head_dim
    x = torch.randn(batch, shape.tokens, 3 * c, generator=g).to(device=device, dtype=dtype)
    x.requires_grad_(True)
    parts = x.split(c, dim=2)
    q, k, v = (
        t.view(batch, shape.tokens, shape.heads, shape.head_dim).transpose(1, 2) for t in parts
    )
    return x, q, k, v


def _forward_backward(name: str, shape: AttentionShape, batch: int, device, dtype, dropout: float):
    """(output, input gradient) of one causal attention with only ``name``'s kernel."""
    from torch.nn.attention import sdpa_kernel

    x, q, k, v = _qkv(shape, batch, device, dtype, seed=0)
    with sdpa_kernel(_sdpa_backend_enum(name)):
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
    grad = torch.randn(y.shape, generator=torch.Generator(device="cpu").manual_seed(1))
    y.backward(grad.to(device=device, dtype=dtype))
    return y.detach(), x.grad


def _rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    a, ref = a.double(), ref.double()
    return float((a - ref).norm() / ref.norm().clamp_min(1e-30))


def agreement(shape: AttentionShape, device: torch.device, names=KERNELS) -> dict[str, Any]:
    """Per kernel, its worst relative error (output, input gradient) against float32 math at
    ``CHECK_BATCH`` sequences of the run's shape, or the reason it cannot run them."""
    batch = min(shape.batch, CHECK_BATCH)
    ref_y, ref_g = _forward_backward("math", shape, batch, device, torch.float32, 0.0)
    out: dict[str, Any] = {}
    for name in names:
        try:
            y, g = _forward_backward(name, shape, batch, device, shape.dtype, 0.0)
        except RuntimeError as e:  # "No available kernel": the shapes or the device
            out[name] = f"unavailable: {str(e).splitlines()[0][:160]}"
            continue
        out[name] = max(_rel_err(y, ref_y), _rel_err(g, ref_g))
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_kernel(name: str, shape: AttentionShape, device: torch.device, reps: int = 10) -> float:
    """Median milliseconds of one forward and backward at the run's full shape."""
    from torch.nn.attention import sdpa_kernel

    x, q, k, v = _qkv(shape, shape.batch, device, shape.dtype, seed=2)
    grad = torch.ones(shape.batch, shape.heads, shape.tokens, shape.head_dim, device=device,
                      dtype=shape.dtype)  # fmt: skip
    times = []
    with sdpa_kernel(_sdpa_backend_enum(name)):
        for i in range(reps + 2):
            _sync(device)
            t0 = time.perf_counter()
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=shape.dropout, is_causal=True)
            y.backward(grad)
            _sync(device)
            if i >= 2:  # two warm-up calls
                times.append((time.perf_counter() - t0) * 1e3)
            x.grad = None
    return sorted(times)[len(times) // 2]


def choose(errors: dict[str, Any], times_ms: dict[str, float]) -> str:
    """The fastest kernel that ran and agrees (``AGREE_RTOL``, or twice flash's own error);
    ``torch`` when none does."""
    flash = errors.get("flash")
    tol = max(AGREE_RTOL, 2 * flash) if isinstance(flash, float) else AGREE_RTOL
    ok = [n for n, e in errors.items() if isinstance(e, float) and e <= tol and n in times_ms]
    return min(ok, key=lambda n: times_ms[n]) if ok else "torch"


def measure(shape: AttentionShape, device: torch.device, names=KERNELS,
            timer: Callable[..., float] = time_kernel) -> dict[str, Any]:  # fmt: skip
    """{choice, errors, ms}: every kernel checked against float32, the agreeing ones timed."""
    errors = agreement(shape, device, names)
    times = {n: round(timer(n, shape, device), 4) for n, e in errors.items()
             if isinstance(e, float)}  # fmt: skip
    errors = {n: round(e, 5) if isinstance(e, float) else e for n, e in errors.items()}
    return {"choice": choose(errors, times), "errors": errors, "ms": times}


_MEASURED: dict[tuple, dict] = {}  # one measurement per shape and device in a process


def configure_sdpa(setting: str, device: torch.device, shape: AttentionShape,
                   broadcast: Callable[[Any], Any] = lambda x: x) -> dict[str, Any]:  # fmt: skip
    """Apply ``setting`` (module docstring) for a run on ``device`` and return what was done:
    {setting, choice[, errors, ms]} (``broadcast``: rank 0's result on every rank)."""
    check_sdpa_backend(setting)
    if device.type != "cuda":
        if setting not in ("auto", "torch"):
            log.warning("sdpa_backend=%s applies to CUDA only; the %s run keeps torch's kernels",
                        setting, device.type)  # fmt: skip
        return {"setting": setting, "choice": "torch"}
    if setting != "auto":
        set_sdpa_backend(setting)
        return {"setting": setting, "choice": setting}
    key = (shape, str(device))
    if key not in _MEASURED:
        set_sdpa_backend("torch")  # the measurement's own switches are sdpa_kernel's
        _MEASURED[key] = broadcast(measure(shape, device))
    result = _MEASURED[key]
    set_sdpa_backend(result["choice"])
    log.info("attention kernel %s, chosen by measurement at %d x %d x %d x %d %s "
             "(forward + backward ms %s; error against float32 %s)", result["choice"],
             shape.batch, shape.heads, shape.tokens, shape.head_dim,
             str(shape.dtype).removeprefix("torch."), result["ms"], result["errors"])  # fmt: skip
    return {"setting": setting, **result}
