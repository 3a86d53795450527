"""Triton, imported only when the engine runs, and the kernels in the mode a device needs.

``triton.jit`` decides at decoration time whether a kernel is compiled for the GPU or run by
Triton's interpreter (``TRITON_INTERPRET=1``, read from the environment when the decorator runs,
Triton 3.x). So the kernel modules (optim/engine/kernel_ops.py, norm_kernels.py, kernels.py)
are executed twice at most, as two sets of module objects: ``kernels("jit")`` for CUDA tensors,
and ``kernels("interpret")`` for CPU tensors, executed with ``TRITON_INTERPRET=1`` set for the
moment of their decoration only (the process's other Triton users, inductor's kernels among
them, are not switched to the interpreter); each imports the ones before it by their own names,
which point at its mode's modules while it is executed. The
interpreter runs each program as numpy code on host memory: CPU tensors only, slow, exact
(float64 is kept), which is what the tests need (tests/test_engine.py).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import torch

HERE = Path(__file__).parent
# the kernel modules, each after those it imports; the last holds every kernel
SOURCES = ("kernel_ops", "norm_kernels", "kernels")


@functools.cache
def triton_missing() -> str | None:
    """Why Triton cannot be imported here, or None."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as e:  # noqa: BLE001 (absent, or broken: either way no engine)
        return f"triton is not importable ({type(e).__name__}: {e})"
    return None


def mode_for(device_type: str) -> str | None:
    """The kernels' mode for tensors on ``device_type``: ``jit``, ``interpret`` or None."""
    return {"cuda": "jit", "cpu": "interpret"}.get(device_type)


@functools.cache
def kernels(mode: str) -> ModuleType:
    """optim/engine/kernels.py executed as its own module in ``mode`` (``jit``/``interpret``),
    with the modules it imports (``SOURCES``) executed in that mode too."""
    if mode not in ("jit", "interpret"):
        raise ValueError(f"unknown kernel mode {mode!r}; valid: jit, interpret")
    before = os.environ.get("TRITON_INTERPRET")
    if mode == "interpret":
        os.environ["TRITON_INTERPRET"] = "1"
    modules: dict[str, ModuleType] = {}
    try:
        for stem in SOURCES:
            modules[f"optim.engine.{stem}"] = _execute(stem, mode, modules)
    finally:
        if before is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = before
    module = modules[f"optim.engine.{SOURCES[-1]}"]
    if interpreted(module):
        for each in modules.values():
            _inline_helpers(each)
    return module


def _execute(stem: str, mode: str, imports: dict[str, ModuleType]) -> ModuleType:
    """optim/engine/``stem``.py executed as ``optim.engine._<stem>_<mode>``, the modules it
    imports (``imports``: their own names -> this mode's modules) in place of their own names
    while it runs."""
    name = f"optim.engine._{stem}_{mode}"
    spec = importlib.util.spec_from_file_location(name, HERE / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the interpreter's rewriter reads the source by module
    saved = {n: sys.modules.get(n) for n in imports}
    sys.modules.update(imports)
    try:
        spec.loader.exec_module(module)
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m
    return module


def _inline_helpers(module: ModuleType) -> None:
    """The kernels' helper functions (``_name``) as the plain functions the interpreter runs.

    Each call of an interpreted device function re-patches ``triton.language`` first (about a
    millisecond); inside a kernel, whose launch has patched it already, that is all the cost of
    a helper. Called as their rewritten functions, the helpers cost what their numpy work does
    (the module's tests run several times faster). The kernels themselves stay launchable."""
    for name, value in list(vars(module).items()):
        if name.startswith("_") and type(value).__name__ == "InterpretedFunction":
            setattr(module, name, value.rewrite())


def interpreted(module: ModuleType) -> bool:
    """Whether ``module``'s kernels run under the interpreter (``TRITON_INTERPRET=1`` set for
    the whole process makes the ``jit`` module interpreted too)."""
    return type(module.step_kernel).__name__ == "InterpretedFunction"


def tl_dtype(dtype: torch.dtype):
    import triton.language as tl

    return {torch.float32: tl.float32, torch.float64: tl.float64, torch.bfloat16: tl.bfloat16,
            torch.float16: tl.float16}[dtype]  # fmt: skip


def warps(block: int) -> int:
    """Warps a program of ``block`` elements runs on: 8 from 2048 up (2048 / 8: 80 registers a
    thread for MARS-AdamW's update on sm_90, 3 CTAs per SM; bench/occupancy.py), else 4."""
    return 8 if block >= 2048 else 4


# Multiply-adds contracted to FMAs on the GPU: Triton's default until 3.9, which warns that 3.10
# turns it off; set here so that every Triton compiles the same code (the interpreter ignores it).
FP_FUSION = True


class Go:
    """Launches a kernel, or with ``dry`` compiles it only (``warmup``: nothing runs)."""

    def __init__(self, dry: bool) -> None:
        self.dry = dry

    def __call__(self, kernel, grid: tuple, *args, **kw) -> None:
        kw.setdefault("enable_fp_fusion", FP_FUSION)
        if self.dry:
            kernel.warmup(*args, grid=grid, **kw)
        else:
            kernel[grid](*args, **kw)
