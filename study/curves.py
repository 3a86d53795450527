"""Every run's curves, kept in the study folder, and the collapse flag read from them.

``curves.csv.gz`` holds, per run (its ``run_dir`` as in results.csv), the training records
(step, tokens, loss, grad norm, clip rate, lr; every ``log_every`` steps) and the validation
records (step, tokens, val loss; at every evaluation) of its ``metrics.jsonl``: a few MB for a
study, enough to plot a cell's runs and to tell a late spike from a plateau that never left.

A run **collapsed** when its final validation loss is at or above the floor the study knows (the
validation split's bigram loss for the byte proxy, or ``--collapse-floor``), when it diverged, or
when its training loss rose by more than ``RISE`` times its lowest point (3-record running means,
so one noisy batch does not count).
"""

from __future__ import annotations

import csv
import gzip
import io
import math
from pathlib import Path

from runtime import runfiles

COLUMNS = ["run_dir", "kind", "step", "tokens", "loss", "grad_norm", "clip_rate", "lr"]
RISE = 1.25  # the training loss's end over its lowest point (running means) that flags a rise


def run_curves(run_dir: Path) -> list[dict]:
    """The train and val records of one run's metrics.jsonl (a resumed run's log holds no
    records past its checkpoint, so each step appears once)."""
    out = []
    for r in runfiles.read_metrics(run_dir):  # a line cut short by a killed process is skipped
        if "val_loss" in r:
            out.append({"kind": "val", "step": r["step"], "tokens": r.get("tokens"),
                        "loss": r["val_loss"]})  # fmt: skip
        elif "train_loss" in r:
            out.append({"kind": "train", "step": r["step"], "tokens": r.get("tokens"),
                        "loss": r["train_loss"], "grad_norm": r.get("grad_norm"),
                        "clip_rate": r.get("clip_rate"), "lr": r.get("lr")})  # fmt: skip
    return out


def rise(train_losses: list[float], window: int = 3) -> float:
    """The last running mean of the training loss over its lowest running mean (1.0: it ended
    at its lowest; inf: a non-finite loss)."""
    xs = [float(x) for x in train_losses]
    if any(not math.isfinite(x) for x in xs):
        return math.inf
    if len(xs) < window:
        return 1.0
    means = [sum(xs[i : i + window]) / window for i in range(len(xs) - window + 1)]
    low = min(means)
    return means[-1] / low if low > 0 else 1.0


def collapse_reason(final_loss: float, floor: float | None, curve: list[dict]) -> str:
    """Why a run counts as collapsed ("" when it did not): ``diverged``, ``floor`` (ended at or
    above the floor), ``rise`` (its training loss rose more than RISE x)."""
    if not math.isfinite(final_loss):
        return "diverged"
    if floor is not None and final_loss >= floor:
        return "floor"
    if rise([r["loss"] for r in curve if r["kind"] == "train"]) > RISE:
        return "rise"
    return ""


def write_curves(curves: dict[str, list[dict]], path: Path) -> None:
    """``{run_dir: records}`` into ``path`` (gzip CSV, numbers at 6 significant digits)."""

    def fmt(v: object) -> object:
        return f"{v:.6g}" if isinstance(v, float) else ("" if v is None else v)

    # mtime 0 and no file name in the gzip header: the same curves give the same bytes
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
        f = io.TextIOWrapper(gz, newline="")
        w = csv.DictWriter(f, fieldnames=COLUMNS, restval="")
        w.writeheader()
        for run_dir, records in curves.items():
            for r in records:
                w.writerow({k: fmt(v) for k, v in {"run_dir": run_dir, **r}.items()})
        f.flush()
        f.detach()


def read_curves(path: Path) -> dict[str, list[dict]]:
    """curves.csv.gz back: ``{run_dir: records}``, numbers as floats, whole numbers written as
    such (a step, a token count) as ints, so that writing them again gives the same bytes
    (empty: missing)."""
    out: dict[str, list[dict]] = {}
    with gzip.open(path, "rt", newline="") as f:
        for r in csv.DictReader(f):
            rec = {"kind": r["kind"]}
            for k in COLUMNS[2:]:
                if r.get(k) not in (None, ""):
                    text = r[k]
                    rec[k] = int(text) if text.lstrip("-").isdigit() else float(text)
            out.setdefault(r["run_dir"], []).append(rec)
    return out
