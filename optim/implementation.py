"""``implementation``: the one setting that says how an optimizer steps (docs/optim-engine.md,
"The setting").

- ``auto`` (default): on CUDA the Triton engine for the buckets it covers, the compiled step for
  the others, then the eager path; on a CPU the eager path (foreach, or the per-tensor loop where
  the class says so: ``VarianceReduced.default_foreach``);
- ``loop``: the per-tensor loop, the readable reference, everywhere;
- ``foreach``: ``torch._foreach`` ops everywhere;
- ``compiled``: the ``torch.compile``d element-wise step (optim/compiled.py) on any device, falling
  back to the eager path where inductor cannot run;
- ``triton``: the Triton engine (optim/engine/) on any device, a CPU through Triton's
  interpreter; what it does not cover takes the compiled step on CUDA, the eager path elsewhere.

Which values an optimizer has: ``CORE`` (every optimizer of optim/core.py), ``SCHEDULE_FREE``
(no compiled step) and ``TORCH_ADAMW`` (torch's AdamW, optim/adamw.py: ``torch-fused`` is torch's
own fused kernel). What the routes read of the setting is derived here and nowhere else
(``engine_wanted``, ``compiled_wanted``, ``eager_foreach``; optim/routes.py decides with them).
"""

from __future__ import annotations

from typing import Any

CORE = ("auto", "loop", "foreach", "compiled", "triton")
SCHEDULE_FREE = ("auto", "loop", "foreach", "triton")
TORCH_ADAMW = ("auto", "loop", "foreach", "torch-fused")
DEFAULT = "auto"


def check(value: Any, valid: tuple[str, ...] = CORE, key: str = "implementation",
          who: str = "") -> None:  # fmt: skip
    """ValueError naming ``value`` and the values ``valid`` (``who``: the optimizer)."""
    if not isinstance(value, str) or value not in valid:
        of = f" for {who}" if who else ""
        raise ValueError(f"unknown {key} {value!r}{of}; valid: {', '.join(valid)} "
                         "(docs/optim-engine.md)")  # fmt: skip


def engine_wanted(implementation: str, device_type: str) -> bool:
    """Whether the setting asks for the Triton engine on the device."""
    return implementation == "triton" or (implementation == "auto" and device_type == "cuda")


def compiled_wanted(implementation: str, device_type: str) -> bool:
    """Whether the setting asks for the compiled step on the device (where the engine did not
    take a bucket)."""
    if implementation == "compiled":
        return True
    return implementation in ("auto", "triton") and device_type == "cuda"


def eager_foreach(implementation: str) -> bool | None:
    """The eager path the setting asks for: True foreach, False the loop, None the class's
    default (``auto``, and what the engine or the compiled step leave)."""
    return {"loop": False, "foreach": True}.get(implementation)
