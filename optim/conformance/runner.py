"""Run an implementation against the stored vectors and say where it leaves the official path.

``check(make, vector_names)`` replays each vector: the same starting weights, per-iteration lrs,
gradients (and exact-mode look-ahead gradients) as the official run, then compares every tensor
after every step with the official weights. An element passes when
``|ours - official| <= atol + rtol * |official|`` (the vector's tolerance, manifest.json).
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from optim.conformance.adapters import Driver, TorchDriver

VECTORS = Path(__file__).parent / "vectors"


def manifest(folder: Path = VECTORS) -> dict:
    """The manifest: official commit, scenario, and one settings entry per vector."""
    return json.loads((folder / "manifest.json").read_text())


def select(patterns: list[str], folder: Path = VECTORS) -> list[dict]:
    """The manifest entries whose name matches one of ``patterns`` (shell-style)."""
    entries = manifest(folder)["vectors"]
    chosen = [e for e in entries if any(fnmatch.fnmatch(e["name"], p) for p in patterns)]
    if not chosen:
        names = ", ".join(e["name"] for e in entries)
        raise ValueError(f"no vector matches {patterns}; the vectors are: {names}")
    return chosen


def for_class(name: str, folder: Path = VECTORS) -> list[dict]:
    """The entries whose official class is called ``name`` (e.g. ``MARS``: the six MARS ones)."""
    return [e for e in manifest(folder)["vectors"] if e["official_class"] == name]


@dataclass
class Result:
    """One vector's outcome: ``failure`` is None on PASS, else ``(step, tensor, abs, rel)`` of
    the first step (1-based) and tensor out of tolerance; ``error`` an exception's message."""

    name: str
    steps: int
    max_abs: float = 0.0
    max_rel: float = 0.0
    failure: tuple[int, str, float, float] | None = None
    error: str | None = None
    tolerance: dict | None = None

    @property
    def passed(self) -> bool:
        return self.failure is None and self.error is None


def load(entry: dict, folder: Path = VECTORS) -> dict:
    return torch.load(folder / entry["file"], weights_only=True)


def run_vector(make: Callable, entry: dict, folder: Path = VECTORS, *,
               set_to_none: bool = False) -> Result:  # fmt: skip
    """Replay one vector through ``make(params, settings)`` (adapters.py) and compare.
    ``set_to_none``: how a returned torch optimizer's gradients are reset (TorchDriver)."""
    vec = load(entry, folder)
    tol = entry["tolerance"]
    result = Result(entry["name"], entry["steps"], tolerance=tol)
    params = {n: vec["init"][n].clone().requires_grad_(True) for n in vec["names"]}
    before = {"ours": dict(vec["init"]), "official": dict(vec["init"])}
    try:
        driver = _driver(make(params, entry), params, set_to_none)
        for t in range(entry["steps"]):
            driver.set_lr({n: float(vec["lrs"][n][t]) for n in vec["names"]})
            if entry["mode"] == "exact":
                driver.reference({n: vec["refs"][n][t] for n in vec["names"]})
            driver.step({n: vec["grads"][n][t] for n in vec["names"]})
            values = driver.values()
            for n in vec["names"]:  # on after a failure: the max errors cover the whole run
                got = values[n].detach().to(torch.float64).reshape(vec["init"][n].shape).clone()
                _compare(result, t + 1, n, got, vec["params"][n][t], tol, before, n)
                before["ours"][n], before["official"][n] = got, vec["params"][n][t]
    except Exception as exc:  # a port that crashes fails the vector; the message says why
        result.error = f"{type(exc).__name__}: {exc}"
    return result


def _driver(made, params, set_to_none: bool) -> Driver:
    if isinstance(made, torch.optim.Optimizer):
        return TorchDriver(made, params, set_to_none=set_to_none)
    return made


def _compare(result: Result, step: int, name: str, got: torch.Tensor, want: torch.Tensor,
             tol: dict, before: dict, key: str) -> bool:  # fmt: skip
    """Record the errors of one tensor; True (and the failure) when it leaves tolerance.

    ``rel`` is the max abs error over the largest official magnitude (elementwise tolerance) or
    the step's update error ``||d_ours - d_official|| / ||d_official||`` (update tolerance)."""
    diff = (got - want).abs()
    abs_err = float(diff.max())
    if "update_rtol" in tol:
        d_ours, d_off = got - before["ours"][key], want - before["official"][key]
        miss, size = float((d_ours - d_off).norm()), float(d_off.norm())
        rel_err = miss / size if size > 0 else (0.0 if miss <= 1e-12 else float("inf"))
        bad = rel_err > tol["update_rtol"]
    else:
        rel_err = abs_err / max(float(want.abs().max()), 1e-300)
        bad = bool((diff > tol["atol"] + tol["rtol"] * want.abs()).any())
    if not torch.isfinite(got).all():
        abs_err = rel_err = float("inf")
        bad = True
    result.max_abs, result.max_rel = max(result.max_abs, abs_err), max(result.max_rel, rel_err)
    if bad and result.failure is None:
        result.failure = (step, name, abs_err, rel_err)
    return bad


def check(make: Callable, entries: list[dict], folder: Path = VECTORS, *,
          set_to_none: bool = False) -> list[Result]:  # fmt: skip
    """Every entry's result, in order."""
    return [run_vector(make, e, folder, set_to_none=set_to_none) for e in entries]


def report(result: Result) -> str:
    """One line: ``NAME PASS (...)`` or ``NAME FAIL step S, TENSOR: ...``."""
    tol = ", ".join(f"{k} {v:g}" for k, v in result.tolerance.items())
    rel = "update rel err" if "update_rtol" in result.tolerance else "rel err"
    if result.error is not None:
        return f"{result.name:20s} FAIL error: {result.error}"
    if result.failure is None:
        return (f"{result.name:20s} PASS ({result.steps} steps; max abs err {result.max_abs:.2e}, "
                f"max {rel} {result.max_rel:.2e}; {tol})")  # fmt: skip
    step, name, abs_err, rel_err = result.failure
    return (f"{result.name:20s} FAIL at step {step} of {result.steps}, {name}: max abs err "
            f"{abs_err:.2e}, {rel} {rel_err:.2e} (whole run: max abs err {result.max_abs:.2e}; "
            f"tolerance {tol})")  # fmt: skip
