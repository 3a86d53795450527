"""A benchmark's raw record: one JSON file per measurement, the figures' source of truth.

Every round of every variant is kept (not only a summary), with what it takes to read it later:
the device, the versions, the command, the commit (and whether the tree was dirty), and per
variant the min, median and max over its rounds. Docs tables are made from these files.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def command() -> list[str]:
    """The command as typed from the repository's root (``python -m bench.x ...``): no
    machine's absolute path in a record."""
    prog = Path(sys.argv[0]).resolve()
    try:
        module = ".".join(prog.relative_to(ROOT).with_suffix("").parts)
    except ValueError:
        return [prog.name, *sys.argv[1:]]
    return ["python", "-m", module, *sys.argv[1:]]


def versions() -> dict[str, str | None]:
    """Python, torch, Triton (None where it is not importable)."""
    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # noqa: BLE001 (absent or broken: recorded as None)
        triton_version = None
    return {"python": platform.python_version(), "torch": torch.__version__,
            "triton": triton_version}  # fmt: skip


def device_facts(device: str | torch.device = "cpu") -> dict:
    """What a GPU figure needs beside it: the accelerator, its driver, CUDA, the versions, the
    float32 matmul precision in effect (TF32 or not: runtime.device.matmul_precision) and the
    CPU; None where a fact does not apply (a CPU has no driver)."""
    from runtime.device import matmul_precision

    device = torch.device(device)
    cuda = device.type == "cuda" and torch.cuda.is_available()
    driver = None
    if cuda:
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)  # fmt: skip
            driver = out.stdout.strip().splitlines()[0] if out.returncode == 0 else None
        except (OSError, subprocess.SubprocessError, IndexError):
            driver = None
    return {
        "gpu": torch.cuda.get_device_name(device) if cuda else None,
        "driver": driver,
        "cuda": torch.version.cuda,
        **versions(),
        **matmul_precision(device),
        "cpu": platform.processor() or platform.machine(),
    }


def provenance() -> dict:
    """The command, the commit and whether the tree was dirty, and the time."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"command": command(), "commit": _git("rev-parse", "HEAD"),
            "dirty": None if status is None else bool(status),
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip


_WRITTEN: dict[str, int] = {}


def measurement(path: str | Path, kind: str, device: str | torch.device, *, rounds: list,
                unit: str, **fields) -> Path:  # fmt: skip
    """Write one measurement's record to ``path`` (a directory: a file named by ``kind``, the
    time and the process is made in it; a file: rewritten, so a measurement taken round by
    round is on disk after each): ``kind`` (which table renders it: bench/tables.py), the
    device's facts, provenance, every round in ``unit`` and its spread, and ``fields``."""
    path = Path(path)
    if path.suffix != ".json":
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        _WRITTEN[kind] = _WRITTEN.get(kind, 0) + 1  # several a second: each its own file
        path = path / f"{kind}-{stamp}-{os.getpid()}-{_WRITTEN[kind]}.json"
    record = {"kind": kind, "facts": device_facts(device), "device": str(device),
              **provenance(), "unit": unit, "rounds": rounds,
              "spread": spread(rounds) if rounds else None, **fields}  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(path)
    return path


def spread(values: list[float]) -> dict[str, float]:
    """min, median and max of a variant's rounds."""
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def device_type(line: str) -> str:
    """The device of a ``device_line`` (``device: cuda (NVIDIA H100 ...), ...``) or a name."""
    return "cuda" if "cuda" in line.split("(")[0] else "cpu"


def write(path: str | Path, *, device: str, rounds: dict[str, list[float]], unit: str,
          extra: dict | None = None) -> Path:  # fmt: skip
    """Write the record of ``rounds`` (variant -> one figure per round, in ``unit``) to ``path``
    (a directory: a file named by the benchmark and the time is made in it)."""
    path = Path(path)
    if path.suffix != ".json":
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        path = path / f"{Path(sys.argv[0]).stem}-{stamp}.json"
    status = _git("status", "--porcelain", "--untracked-files=no")
    record = {
        "device": device,
        "cpu_count": os.cpu_count(),
        "versions": versions(),
        "facts": device_facts(device_type(device)),
        "command": command(),
        "commit": _git("rev-parse", "HEAD"),
        "dirty": None if status is None else bool(status),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "unit": unit,
        "rounds": rounds,
        "summary": {k: spread(v) for k, v in rounds.items() if v},
        **(extra or {}),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def in_processes(module: str, argv: list[str], n: int) -> int:
    """``python -m module`` with ``argv`` (less ``--processes N``) ``n`` times, one process
    after another, each told ``--process i`` (its records say which); the last non-zero exit
    status, or 0. Each process writes its own records as it measures: one cut off keeps the
    earlier ones'."""
    argv = list(argv)
    if "--processes" in argv:
        i = argv.index("--processes")
        del argv[i : i + 2]
    rc = 0
    for k in range(1, n + 1):
        print(f"== process {k} of {n}", flush=True)
        done = subprocess.run([sys.executable, "-m", module, *argv, "--process", str(k)],
                              cwd=ROOT, check=False)  # fmt: skip
        rc = done.returncode or rc
    return rc
