"""One training run in its directory: its counters, the directory chosen and checked before any
file is written, the run files and logger opened, and the summary written at the end (its state
is saved and restored by ``trainer.checkpoint``).

The directory's name comes from the entry point (train.py reads Hydra's output directory and
overrides); everything here takes plain values.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime import runfiles
from runtime.distributed import DistInfo, broadcast_object
from trainer import checkpoint as ckpt
from trainer.config import TrainConfig
from trainer.logs import MetricsLogger, init_wandb, truncate_metrics
from trainer.rundir import check_run_dir, write_run_files

log = logging.getLogger(__name__)


@dataclass
class RunState:
    step: int = 0  # completed optimizer steps
    tokens: int = 0
    best_val_loss: float | None = None
    last_val_loss: float | None = None
    last_train_loss: float | None = None
    elapsed_s: float = 0.0  # wall-clock seconds of the run's earlier sessions (restarts)
    skipped_steps: int = 0  # steps not applied: non-finite loss/gradient (trainer/nonfinite.py)


def on_main(dist: DistInfo, fn, *args) -> None:
    """Run ``fn`` on rank 0; a SystemExit/ValueError/FileNotFoundError there stops every rank."""
    error = None
    if dist.is_main:
        try:
            fn(*args)
        except (SystemExit, ValueError, FileNotFoundError) as exc:
            error = str(exc)
    error = broadcast_object(error)
    if error:
        raise SystemExit(error)


def prepare_out_dir(
    name: str, resume: str, config_dict: dict, dist: DistInfo
) -> tuple[Path, Path | None]:
    """The run directory (rank 0's ``name``, shared by all) and the checkpoint to resume from;
    rank 0 refuses a directory that holds another run (``check_run_dir``)."""
    out_dir = Path(broadcast_object(name))
    resume_path = ckpt.resolve_resume(resume, out_dir)
    on_main(dist, check_run_dir, out_dir, config_dict, resume_path is not None, resume)
    if resume_path is None and resume == "auto" and (out_dir / runfiles.METRICS).exists():
        log.warning("%s holds a run stopped before its first checkpoint: starting it over", out_dir)
    return out_dir, resume_path


def finished_summary(out_dir: Path, step: int, max_steps: int) -> dict | None:
    """The summary of a run that an earlier session finished (a relaunched table or sweep): its
    checkpoint is at ``max_steps`` and its summary was written."""
    return runfiles.read_summary(out_dir) if step >= max_steps else None


def open_run(
    cfg: TrainConfig, config_dict: dict, dist: DistInfo, out_dir: Path, resume_path: Path | None,
    step: int, sdpa: dict | None = None,
) -> MetricsLogger:  # fmt: skip
    """Rank 0 writes the config and run metadata (``sdpa``: the attention kernel and why,
    runtime/attention.py), cuts ``metrics.jsonl`` back to ``step`` (the
    checkpoint's) and starts wandb; every rank gets the logger (it writes on rank 0 only)."""
    wandb_run = None
    if dist.is_main:
        meta = {
            "world_size": dist.world_size,
            "device": str(dist.device),
            "resume_from": str(resume_path) if resume_path else None,
        }
        if sdpa is not None:
            meta["sdpa"] = sdpa
        write_run_files(out_dir, config_dict, meta)
        truncate_metrics(out_dir, step if resume_path else -1)  # a fresh start keeps nothing
        wandb_run = init_wandb(cfg.wandb, out_dir, config_dict, cfg.name)
    return MetricsLogger(out_dir, enabled=dist.is_main, wandb_run=wandb_run)


def finish_run(
    cfg: TrainConfig, dist: DistInfo, state: RunState, out_dir: Path, *, parameters: int,
    wall_seconds: float, elapsed_s: float,
) -> dict[str, Any]:  # fmt: skip
    """The run's summary, written by rank 0 to ``summary.json``; ``wall_seconds`` is this
    session's, ``elapsed_s`` the run's over all its sessions."""
    summary = {
        "steps": state.step,
        "tokens": state.tokens,
        "final_train_loss": state.last_train_loss,
        "final_val_loss": state.last_val_loss,
        "best_val_loss": state.best_val_loss,
        "parameters": parameters,
        "model": cfg.model.name,
        "optimizer": cfg.optimizer.name,
        "world_size": dist.world_size,
        "wall_seconds_this_session": round(wall_seconds, 1),
        "elapsed_s": elapsed_s,
        "skipped_steps": state.skipped_steps,
        "out_dir": str(out_dir),
    }
    if dist.is_main:
        runfiles.write_summary(out_dir, summary)
    return summary
