"""Logging: the console (rank 0), ``metrics.jsonl`` in the run directory, and wandb.

Every metrics record is one JSON object per line with at least ``step`` and ``tokens``.
"""

from __future__ import annotations

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
        self._file = open(self.path, "a", encoding="utf-8") if enabled else None

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        assert "step" in record and "tokens" in record, record
        record = {k: _clean(v) for k, v in record.items() if v is not None}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self.wandb_run is not None:
            self.wandb_run.log(record, step=record["step"])

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None


def truncate_metrics(out_dir: str | Path, step: int) -> None:
    """Drop records past ``step`` (logged after the checkpoint a resumed run starts from)."""
    path = Path(out_dir) / runfiles.METRICS
    if not path.exists():
        return
    kept = [ln for ln in path.read_text().splitlines() if _step_of(ln) <= step]
    with atomic_open(path, "w") as f:  # a kill meanwhile leaves the old file whole
        f.write("".join(ln + "\n" for ln in kept))


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
