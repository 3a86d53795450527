"""Logging: the console (rank 0), ``metrics.jsonl`` in the run directory, and wandb.

Every metrics record is one JSON object per line with at least ``step`` and ``tokens``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import secrets
import sys
from pathlib import Path
from typing import Any

from runtime import runfiles
from runtime.files import atomic_open

log = logging.getLogger(__name__)


def setup_logging(is_main: bool) -> None:
    """INFO on rank 0, WARNING elsewhere, to stdout in a compact format."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO if is_main else logging.WARNING)


def _clean(value: Any) -> Any:
    """JSON-safe scalar: NaN/inf become strings (JSON has no literal for them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class MetricsLogger:
    """Appends records to ``metrics.jsonl`` and mirrors them to wandb (rank 0 only)."""

    def __init__(self, out_dir: str | Path, enabled: bool, wandb_run: Any = None) -> None:
        self.path = Path(out_dir) / runfiles.METRICS
        self.enabled = enabled
        self.wandb_run = wandb_run
        # unbuffered: a failed write fails here, not again when the file is closed
        self._file = open(self.path, "ab", buffering=0) if enabled else None

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        assert "step" in record and "tokens" in record, record
        record = {k: _clean(v) for k, v in record.items() if v is not None}
        append_line(self._file, self.path, json.dumps(record))
        if self.wandb_run is not None:
            self.wandb_run.log(record, step=record["step"])

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None


def disk_error(path: Path, exc: OSError) -> SystemExit:
    """The one line of a run file that could not be written (a full disk, most often)."""
    what = exc.strerror or str(exc)
    return SystemExit(
        f"could not write {path}: {what}; the record was not kept and the file is whole up to "
        f"its previous line. Free disk space or fix the permissions of {path.parent}, then run "
        "the same command again: resume=auto continues from the newest checkpoint"
    )


def append_line(f: Any, path: Path, line: str) -> None:
    """Append ``line`` to the open unbuffered file ``f`` whole or not at all: on a failed write (a
    full disk) the file is cut back to where it was, and the run stops with one line."""
    start, data = f.tell(), memoryview((line + "\n").encode("utf-8"))
    try:
        while data:  # an unbuffered write may take part of it
            data = data[f.write(data) :]
    except OSError as exc:
        with contextlib.suppress(OSError):
            f.truncate(start)  # never leave half a line behind
        raise disk_error(path, exc) from None


def truncate_metrics(out_dir: str | Path, step: int) -> None:
    """Drop records past ``step`` (logged after the checkpoint a resumed run starts from)."""
    path = Path(out_dir) / runfiles.METRICS
    if not path.exists():
        if step > 0:  # resumed, and the history is gone: said, and marked in the file
            mark_metrics_gap(path, step)
        return
    kept = [ln for ln in path.read_text().splitlines() if _step_of(ln) <= step]
    with atomic_open(path, "w") as f:  # a kill meanwhile leaves the old file whole
        f.write("".join(ln + "\n" for ln in kept))


def mark_metrics_gap(path: Path, step: int) -> None:
    """A resumed run whose ``metrics.jsonl`` is gone: the checkpoint holds no per-step history
    to rebuild it from, so the gap is said and marked by a first record ``{"step": N, "gap":
    ...}`` (readers that plot losses skip it: it has none)."""
    gap = f"{path.name} was missing when the run resumed at step {step}: steps 1-{step} not kept"
    log.warning("%s: %s", path.parent, gap)
    with atomic_open(path, "w") as f:
        f.write(json.dumps({"step": step, "tokens": None, "gap": gap}) + "\n")


def _step_of(line: str) -> float:
    """A record's step; a line cut short by a killed process counts as past every step."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return math.inf


def display_name(out_dir: Path) -> str:
    """A run's name for people: its directory below ``runs/`` (``owt/small-adamw``,
    ``<sweep>/optimizer.lr=0.003``), or the directory's own name elsewhere."""
    parts = out_dir.resolve().parts
    if "runs" in parts[:-1]:
        last = len(parts) - 1 - parts[::-1].index("runs")
        return "/".join(parts[last + 1 :])
    return out_dir.name


def init_wandb(cfg: Any, out_dir: Path, config_dict: dict, run_name: str | None = None) -> Any:
    """Start (or resume) the wandb run of ``out_dir``; None when wandb.mode is disabled.

    The wandb name is the run directory below ``runs/``; the group is ``wandb.group`` (the
    experiments' table, e.g. ``owt``), else the run's name (an experiment or optimizer)."""
    if cfg.mode == "disabled":
        return None
    import wandb  # imported lazily: it is slow to import and unused when disabled

    id_file = out_dir / "wandb_id.txt"
    run_id = id_file.read_text().strip() if id_file.exists() else secrets.token_hex(8)
    id_file.write_text(run_id)
    return wandb.init(
        project=cfg.project,
        entity=cfg.entity,
        name=cfg.name or display_name(out_dir),
        group=cfg.group or run_name,
        tags=list(cfg.tags),
        config=config_dict,
        dir=str(out_dir),
        id=run_id,
        resume="allow",
        mode=cfg.mode,
    )
