"""``implementation``: the one setting that says how an optimizer steps (docs/optim-engine.md,
"The setting"). It replaced the switches ``fused`` (None, True, False, "engine") and ``foreach``:
a constructor takes neither (Python refuses the keyword), the config check refuses them in one
line (``hint``: trainer/checks.py, trainer/cli_checks.py) and a run directory written before
continues with the implementation that steps as they did (``from_earlier``: trainer/rundir.py).

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
Standard library only: the command line's checks (trainer/cli_checks.py) read ``HINT`` from this
file without importing torch.
"""

from __future__ import annotations

from typing import Any

CORE = ("auto", "loop", "foreach", "compiled", "triton")
SCHEDULE_FREE = ("auto", "loop", "foreach", "triton")
TORCH_ADAMW = ("auto", "loop", "foreach", "torch-fused")
DEFAULT = "auto"
# The one line that answers an earlier version's key (``{key}``: ``optimizer.fused`` on the
# command line or in a YAML file, ``fused=`` as a keyword).
HINT = ("{key} was replaced by {prefix}implementation=auto|loop|foreach|compiled|triton "
        "(torch's AdamW: auto|loop|foreach|torch-fused; docs/optim-engine.md)")  # fmt: skip
REPLACED = ("fused", "foreach")
# An earlier version's value and the implementation that steps as it did
FROM_FUSED = {None: "auto", True: "compiled", "engine": "triton", False: "foreach"}
FROM_FOREACH = {None: "auto", True: "foreach", False: "loop"}


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


def hint(key: str, value: Any = ..., prefix: str = "") -> str:
    """The one line that refuses an earlier version's ``key`` (``fused``, ``foreach``), naming the
    implementation that steps as ``value`` did where there is one."""
    table = FROM_FUSED if key == "fused" else FROM_FOREACH
    try:
        same = table.get(value) if value is not ... else None
    except TypeError:  # an unhashable value
        same = None
    if same is None:
        return HINT.format(key=prefix + key, prefix=prefix)
    return (
        f"{prefix}{key}={value!r} was replaced by {prefix}implementation={same} (one of "
        f"{'|'.join(CORE)}; torch's AdamW: {'|'.join(TORCH_ADAMW)}; docs/optim-engine.md)"
    )


def from_earlier(section: dict) -> dict:
    """An optimizer config section written by an earlier version (``fused``/``foreach``) with
    ``implementation`` in their place, where one value steps as they did; ValueError with one line
    where none does. A section without them is returned as it is."""
    if not any(k in section for k in REPLACED):
        return section
    name, fused, foreach = section.get("name"), section.get("fused"), section.get("foreach")
    if "implementation" in section:
        found = None
    elif name == "adamw":  # torch's: fused on CUDA (None), its kernel (True), foreach (False)
        found = {None: "auto", True: "torch-fused", False: "foreach"}.get(fused)
    elif name == "adamw-schedulefree":  # foreach: true was its default
        found = "auto" if foreach in (None, True) and fused is None else None
    elif foreach in (None, True):  # every class with a foreach field defaulted to foreach
        found = FROM_FUSED.get(fused) if isinstance(fused, str | bool | None) else None
    else:
        found = "loop" if fused is False else None
    if found is None:
        said = ", ".join(f"{k}={section[k]!r}" for k in REPLACED if k in section)
        raise ValueError(
            f"optimizer {said} (an earlier version's switches) has no optimizer.implementation "
            "that steps the same way; continue that run at the commit that started it, or start "
            "a new one (another name=NAME or out_dir=DIR)"
        )
    out = {k: v for k, v in section.items() if k not in REPLACED}
    out["implementation"] = found
    return out
