"""Where and how fast each run ran, for ``python -m report``: host, device, processes, tokens/s.

Wall-clock comparisons (the time figures) only mean something when the runs were made on the
same kind of machine under the same load. ``meta.jsonl`` (one line per (re)start, written by the
trainer) gives each run's host, device and world size; ``metrics.jsonl`` its tokens/s. The
report states, beside the time figures, when these differ between the runs it compares.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime import runfiles

# Runs of one model and batch whose median tokens/s differ by more than this ratio were made on
# different hardware or under different load: an optimizer's own per-step cost rarely differs so
# much (MARS-exact's second forward-backward, about 2x, is the exception and is named as such).
THROUGHPUT_RATIO = 1.3


@dataclass
class Conditions:
    """What one run ran on (every (re)start counted) and its median logged tokens/s."""

    hosts: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)  # "cuda:0" -> "cuda"; a device_name if any
    world_sizes: list[int] = field(default_factory=list)
    tokens_per_s: float | None = None

    @property
    def world_size(self) -> int | None:
        """The number of processes (the largest, if restarts differed); None when unknown."""
        return max(self.world_sizes, default=None)

    def machine(self) -> str | None:
        """``host/device`` (several joined by ``+`` for a run restarted elsewhere), or None."""
        if not self.hosts and not self.devices:
            return None
        hosts = "+".join(self.hosts) or "?"
        return f"{hosts}/{'+'.join(self.devices) or '?'}"


def _add(values: list, value: Any) -> None:
    if value is not None and value not in values:
        values.append(value)


def read_conditions(
    run_dir: Path, records: list[dict[str, Any]], summary: dict[str, Any] | None
) -> Conditions:
    """The conditions of one run from its meta.jsonl, metrics records and summary (any missing:
    the fields stay empty)."""
    out = Conditions()
    for entry in runfiles.read_meta(run_dir):  # tolerant: a line being written is skipped
        _add(out.hosts, entry.get("host"))
        device = entry.get("device_name") or entry.get("device")
        _add(out.devices, str(device).split(":")[0] if device is not None else None)
        if isinstance(entry.get("world_size"), int):
            _add(out.world_sizes, entry["world_size"])
    if not out.world_sizes and isinstance((summary or {}).get("world_size"), int):
        out.world_sizes.append(summary["world_size"])
    speeds = [
        float(r["tokens_per_s"])
        for r in records
        if isinstance(r.get("tokens_per_s"), int | float) and r["tokens_per_s"] > 0
    ]
    out.tokens_per_s = statistics.median(speeds) if speeds else None
    return out


def time_caveats(runs: list[tuple[str, str, Any, Conditions]]) -> list[str]:
    """Why a wall-clock comparison of ``runs`` may mislead; empty when nothing is known to differ.

    ``runs`` holds (name, model, batch_tokens, conditions) per run: a label or directory for the
    message, and what makes tokens/s comparable.
    """
    out = []
    machines: dict[str, list[str]] = {}
    for name, _, _, c in runs:
        if (m := c.machine()) is not None:
            machines.setdefault(m, []).append(name)
    if len(machines) > 1:
        where = "; ".join(f"{m}: {', '.join(names)}" for m, names in machines.items())
        out.append(f"runs made on different machines (host/device: {where})")
    sizes: dict[int, list[str]] = {}
    for name, _, _, c in runs:
        if c.world_size is not None:
            sizes.setdefault(c.world_size, []).append(name)
    if len(sizes) > 1:
        procs = "; ".join(f"{n} proc.: {', '.join(names)}" for n, names in sorted(sizes.items()))
        out.append(f"runs made with different numbers of processes ({procs})")
    out += _throughput_caveats(runs)
    return out


def _throughput_caveats(runs: list[tuple[str, str, Any, Conditions]]) -> list[str]:
    """Runs of one model and batch whose median tokens/s are more than THROUGHPUT_RATIO apart."""
    groups: dict[tuple[str, str], list[tuple[str, float]]] = {}
    for name, model, batch, c in runs:
        if c.tokens_per_s is not None:
            groups.setdefault((model, str(batch)), []).append((name, c.tokens_per_s))
    out = []
    for (model, batch), speeds in groups.items():
        low, high = min(s for _, s in speeds), max(s for _, s in speeds)
        if high > THROUGHPUT_RATIO * low:
            each = ", ".join(f"{n} {s:,.0f}" for n, s in speeds)
            out.append(
                f"tokens/s differ {high / low:.1f}x between runs of {model} at batch {batch} "
                f"({each}; more than {THROUGHPUT_RATIO}x): a loaded or different machine, not "
                "only the optimizer (an exact-mode MARS step costs about 2x)"
            )
    return out
