"""Per-device facts: autocast dtype, the peak bf16 throughput used for MFU, and the backend and
allocator settings of training."""

from __future__ import annotations

import contextlib
import logging
import re

import torch

log = logging.getLogger(__name__)

# The oldest torch this code runs on (docs/gpu-readiness.md: what each newer version adds).
# Below 2.5 the imports of DCP's stager and SDPA's ``scale=`` path are not all there; on 2.5 to
# 2.7 a few features fall back, each with a logged reason, instead of raising.
MIN_TORCH = "2.5"


def version_tuple(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as ``2.13.0+cpu`` or ``2.6.0a0+git1234``."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"cannot read a torch version from {version!r}")
    return int(match.group(1)), int(match.group(2))


def check_torch(minimum: str = MIN_TORCH) -> str:
    """Stop with one line naming the torch found and the one needed when it is older than
    ``minimum``; returns the version found (logged at start-up)."""
    found = torch.__version__
    if version_tuple(found) < version_tuple(minimum):
        raise SystemExit(
            f"torch {found} is too old: this code needs torch {minimum} or newer "
            f"(pip install 'torch>={minimum}'; docs/gpu-readiness.md lists what each version adds)"
        )
    log.info("torch %s (this code needs %s or newer)", found, minimum)
    return found


# Dense (no sparsity) bf16 tensor-core peaks, FLOP/s, from the vendors' data sheets. Matched by
# substring of torch.cuda.get_device_name(); the first match wins, so specific names come first.
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("H200", 989e12),
    ("GH200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),  # NVL's data sheet: 1,671 TFLOP/s with sparsity, half of it dense
    ("H100", 989e12),  # SXM
    ("H800", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L40", 181e12),
    ("L4", 121e12),
    ("A10G", 70e12),
    ("A10", 125e12),
    ("RTX 4090", 165e12),
    ("RTX 3090", 71e12),
    ("V100", 125e12),  # fp16: V100 has no bf16 tensor cores
)


def peak_flops_of(name: str) -> float | None:
    """Peak bf16 FLOP/s of a CUDA device called ``name``, or None if it is not in the table."""
    for key, flops in PEAK_BF16_FLOPS:
        if key in name:
            return flops
    return None


def peak_flops(device: torch.device) -> float | None:
    """Peak bf16 FLOP/s of ``device``, or None where unknown (CPU, unlisted GPUs)."""
    if device.type != "cuda":
        return None
    return peak_flops_of(torch.cuda.get_device_name(device))


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto``: bf16 on CUDA (fp32 master weights), fp32 elsewhere."""
    table = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
    }
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in table:
        raise ValueError(f"unknown dtype {dtype!r}; valid dtypes: auto, float32, bfloat16")
    return table[dtype]


def autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """Mixed-precision context for forward passes (a no-op in fp32)."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def tune_host_allocator() -> bool:
    """Keep freed CPU memory in glibc's heap instead of returning it to the OS each step.

    CPU training of a GPT-2-vocabulary model allocates and frees logits tensors of tens to
    hundreds of MB per micro-step; by default glibc serves each with a fresh mmap, and the page
    faults that follow take a large share of the step (system time). `bench/train_step.py`
    on the 2-core dev machine (tiny model, 16 x 128 tokens per step, best of 4 steps): 1,578
    tokens/s at micro-batch 8 untuned, 1,944 tuned; 2,529 tuned at micro-batch 2. The process keeps its
    peak memory instead. Linux/glibc only; returns whether the settings were applied.
    """
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl)
        return False
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
    ok = mallopt(m_mmap_threshold, 32 * 1024**2)  # glibc's largest allowed value
    ok &= mallopt(m_trim_threshold, 2**31 - 1)
    ok &= mallopt(m_top_pad, 256 * 1024**2)
    return bool(ok)


def configure_backends(device: torch.device, tf32: bool = True) -> None:
    """Training's backend settings: on CUDA the float32 matmul precision (``tf32``, the config key
    of the same name: TF32 matmuls and convolutions, ``set_float32_matmul_precision("high")``;
    false: true float32, ``"highest"``), the glibc allocator tuned on the CPU
    (``tune_host_allocator``; a CPU has no TF32, and its precision setting is left alone)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = bool(tf32)
        torch.backends.cudnn.allow_tf32 = bool(tf32)
        torch.set_float32_matmul_precision("high" if tf32 else "highest")
    elif device.type == "cpu":
        tune_host_allocator()


def matmul_precision(device: torch.device) -> dict:
    """The float32 matmul precision in effect for ``device`` (a run's meta.jsonl, a bench
    record): ``tf32`` (None off CUDA: a CPU has none) and torch's precision name."""
    tf32 = bool(torch.backends.cuda.matmul.allow_tf32) if device.type == "cuda" else None
    return {"tf32": tf32, "float32_matmul_precision": torch.get_float32_matmul_precision()}
