"""What every benchmark shares: the device line, timing, the model and optimizer variants, the
compile counters, and argument-parsing pieces. Model shapes come from configs/
(runtime.config_files)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import re
import time
from collections.abc import Callable

import torch

import optim
from model import GPTConfig
from runtime.config_files import config_names, load_config

GPU_MODELS = ("gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl")
SHARED = {"gpt2-small": "small", "gpt2-medium": "medium", "gpt2-large": "large", "gpt2-xl": "xl"}


def model_config(name: str) -> GPTConfig:
    """configs/model/<name>.yaml as a GPTConfig; one clear line for an unknown name."""
    if name not in config_names("model"):
        raise SystemExit(
            f"unknown model {name!r}; valid models: {', '.join(config_names('model'))}"
        )
    return GPTConfig(**load_config(f"model/{name}"))


def paper_micro_batch(name: str) -> int:
    """The official runs' micro-batch per GPU (configs/shared/<size>.yaml), else 2 (the demo's)."""
    size = SHARED.get(name)
    return load_config(f"shared/{size}")["micro_batch_size"] if size else 2


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from runtime.runfiles import cpu_name

    return cpu_name()


def device_line(device: torch.device | str = "cpu") -> str:
    """``device: cuda (NVIDIA H100 ...), 16 cores, Python 3.11, torch 2.11``: every benchmark's
    first line."""
    device = torch.device(device)
    return (f"device: {device} ({device_name(device)}), {os.cpu_count()} cores, "
            f"{torch.get_num_threads()} threads, Python {platform.python_version()}, "
            f"torch {torch.__version__}")  # fmt: skip


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], object], device: torch.device) -> float:
    """Wall-clock seconds of one call, the device synchronised before and after."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def best_time(fn: Callable[[], object], device: torch.device, steps: int) -> float:
    return min(time_call(fn, device) for _ in range(steps))


def optimizer_variants(names: list[str], exact: bool) -> list[tuple[str, object]]:
    """(label, optimizer config) for each name, plus its exact mode where it has one."""
    out = []
    for name in names:
        cls = optim.get_spec(name).config_cls
        out.append((name, cls()))
        if exact and "mode" in {f.name for f in dataclasses.fields(cls)}:
            out.append((f"{name} exact", cls(mode="exact")))
    return out


def compile_counters() -> dict[str, int]:
    """torch._dynamo's counts since the last ``reset_compiled``: graphs compiled, graph breaks,
    recompilations (compiles of a frame already compiled: compile id ``frame/n`` with n > 0)."""
    from torch._dynamo.utils import counters, get_compilation_metrics

    ids = [str(getattr(m, "compile_id", "") or "") for m in get_compilation_metrics()]
    recompiles = sum(1 for i in ids if re.match(r"^\d+/([1-9]\d*)", i.split("]")[-1]))
    return {
        "graphs": int(counters["stats"]["unique_graphs"]),
        "graph_breaks": int(sum(counters["graph_break"].values())),
        "recompiles": recompiles,
    }


def reset_compiled() -> None:
    """Forget every compiled graph, guard and count (torch._dynamo.reset), so the next
    measurement compiles its own static graphs: otherwise a second model size recompiles the same
    code dynamic, and the fused optimizer's cache limit fills."""
    from torch._dynamo.utils import clear_compilation_metrics, counters

    torch._dynamo.reset()
    counters.clear()
    clear_compilation_metrics()


def add_device_args(ap: argparse.ArgumentParser, model: str | None = "tiny") -> None:
    """--device, and --model (a configs/model preset) unless ``model`` is None."""
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    if model is not None:
        ap.add_argument("--model", default=model, help="a configs/model/*.yaml preset")
