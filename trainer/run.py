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

import torch

from runtime import runfiles
from runtime.device import matmul_precision
from runtime.distributed import DistInfo, broadcast_object
from trainer import checkpoint as ckpt
from trainer.config import TrainConfig, checkpointing
from trainer.logs import MetricsLogger, init_wandb, truncate_metrics
from trainer.rundir import check_run_dir, write_run_files
from trainer.runlock import RunLock

log = logging.getLogger(__name__)
DIVERGED = runfiles.DIVERGED


@dataclass
class RunState:
    step: int = 0  # completed optimizer steps
    tokens: int = 0
    best_val_loss: float | None = None
    last_val_loss: float | None = None
    last_train_loss: float | None = None
    elapsed_s: float = 0.0  # wall-clock seconds of the run's earlier sessions (restarts)
    skipped_steps: int = 0  # steps not applied: non-finite loss/gradient (trainer/nonfinite.py)
    nonfinite_in_a_row: int = 0  # non-finite steps in a row up to ``step``: resumed runs count on
    stopped: str | None = None  # why the run stopped short of max_steps: "diverged", or None
    stop_message: str | None = None  # the one line it stopped with


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
) -> tuple[Path, Path | None, RunLock]:
    """The run directory (rank 0's ``name``, shared by all), the checkpoint to resume from and
    the directory's lock, held by rank 0 (``RunLock``; release it when the run ends). Rank 0
    refuses a directory that holds another run (``check_run_dir``) or that another process holds,
    before anything is written."""
    out_dir = Path(broadcast_object(name))
    resume_path = ckpt.resolve_resume(resume, out_dir)
    on_main(dist, check_run_dir, out_dir, config_dict, resume_path is not None, resume, dist.device)
    lock = RunLock(out_dir)
    on_main(dist, lock.acquire)  # one process per run directory; only rank 0 of the job holds it
    resume_path = ckpt.resolve_resume(resume, out_dir)  # again, now that no one else writes
    if resume_path is None and resume == "auto" and (out_dir / runfiles.METRICS).exists():
        log.warning("%s holds a run stopped before its first checkpoint: starting it over", out_dir)
    return out_dir, resume_path, lock


def check_not_diverged(state: RunState, resume_diverged: bool, out_dir: Path, path: Path) -> None:
    """A run whose checkpoint ``path`` records that it stopped for divergence is refused in one
    line saying what to change, unless ``nonfinite.resume_diverged=true``: then it goes on with
    its count of non-finite steps in a row started afresh."""
    if state.stopped != DIVERGED:
        return
    if resume_diverged:
        log.warning("%s stopped at step %d for divergence; going on from it as asked "
                    "(nonfinite.resume_diverged=true)", out_dir, state.step)  # fmt: skip
        state.stopped = state.stop_message = None
        state.nonfinite_in_a_row = 0
        return
    earlier = [p for p in ckpt.list_checkpoints(out_dir) if p.name < path.name]
    back = f"resume={earlier[-1]} (an earlier checkpoint)" if earlier else "resume=never"
    raise SystemExit(
        f"{out_dir} stopped at step {state.step}: it diverged ({state.nonfinite_in_a_row} "
        f"non-finite steps in a row), and the same command would stop the same way. Change what "
        f"diverged: a lower optimizer.lr (a new run), or {back}; to go on from step {state.step} "
        "anyway: nonfinite.resume_diverged=true"
    )


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
    meta = {
        "world_size": dist.world_size,
        "device": str(dist.device),
        # the accelerator's name (a study's ledger says which rows ran where: study/results.py)
        "gpu": torch.cuda.get_device_name(dist.device) if dist.device.type == "cuda" else None,
        "resume_from": str(resume_path) if resume_path else None,
        # the float32 matmul precision in effect (the config's tf32, runtime.device
        # configure_backends): tf32 true/false on CUDA, None on a CPU (it has none)
        **matmul_precision(dist.device),
    }
    if sdpa is not None:
        meta["sdpa"] = sdpa
    meta["checkpointing"] = checkpointing(cfg, dist.world_size)  # what auto chose, and why
    on_main(dist, _start_files, out_dir, config_dict, meta, step if resume_path else -1)
    wandb_run = init_wandb(cfg.wandb, out_dir, config_dict, cfg.name) if dist.is_main else None
    return MetricsLogger(out_dir, enabled=dist.is_main, wandb_run=wandb_run)


def _start_files(out_dir: Path, config_dict: dict, meta: dict, step: int) -> None:
    """Rank 0's first writes of a session: config, meta.jsonl, metrics.jsonl cut back to
    ``step`` (-1: a fresh start keeps nothing); a full disk stops every rank with one line."""
    try:
        write_run_files(out_dir, config_dict, meta)
        truncate_metrics(out_dir, step)
    except OSError as exc:
        what = exc.strerror or str(exc)
        what = what if str(out_dir) in what else f"could not write to {out_dir}: {what}"
        raise SystemExit(f"{what}. Free disk space or fix the permissions of {out_dir}, then run "
                         "the same command again") from None  # fmt: skip


def record_routes(optimizer: Any, dist: DistInfo, out_dir: Path | None) -> bool:
    """After a session's first optimizer step: the routes its buckets took and why
    (optim/routes.py ``taken``), logged once (a line per route) and added to this session's
    record of meta.jsonl by rank 0. Whether they were known (a skipped step took none yet)."""
    from optim.routes import lines, taken

    routes = taken(optimizer)
    if not routes:
        return False
    if dist.is_main:
        for line in lines(routes):
            log.info("%s", line)
        if out_dir is not None and (out_dir / runfiles.META).is_file():
            try:
                runfiles.add_to_session(out_dir, {"optimizer_routes": routes})
            except OSError as exc:  # summary.json still names them; the run goes on
                log.warning("optimizer routes not written to meta.jsonl: %s", exc)
    return True


def finish_run(
    cfg: TrainConfig, dist: DistInfo, state: RunState, out_dir: Path, *, parameters: int,
    wall_seconds: float, elapsed_s: float, optimizer: torch.optim.Optimizer | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The run's summary, written by rank 0 to ``summary.json``; ``wall_seconds`` is this
    session's, ``elapsed_s`` the run's over all its sessions; the routes ``optimizer``'s buckets
    took in its last step (optim/routes.py)."""
    from optim.routes import taken

    routes = taken(optimizer) if optimizer is not None else {}
    diverged = state.stopped == DIVERGED
    summary = {
        "steps": state.step,
        "tokens": state.tokens,
        # a diverged run has no final loss (the study counts it as diverged, not as its last)
        "final_train_loss": None if diverged else state.last_train_loss,
        "final_val_loss": None if diverged else state.last_val_loss,
        "best_val_loss": state.best_val_loss,
        "parameters": parameters,
        "model": cfg.model.name,
        "optimizer": cfg.optimizer.name,
        "world_size": dist.world_size,
        "wall_seconds_this_session": round(wall_seconds, 1),
        "elapsed_s": elapsed_s,
        "skipped_steps": state.skipped_steps,
        "nonfinite_in_a_row": state.nonfinite_in_a_row,
        "stopped": state.stopped,  # "diverged": never finished (runtime/runfiles.py)
        "stop_reason": state.stop_message,
        # the route each of the optimizer's buckets took in the last step, and why
        # (optim/routes.py): which code a result came from
        "optimizer_routes": routes or {},
        "out_dir": str(out_dir),
    }
    if diverged:
        summary["last_val_loss"] = state.last_val_loss  # the last finite ones, for a look
        summary["last_train_loss"] = state.last_train_loss
    if dist.is_main:
        runfiles.write_summary(out_dir, summary)
        if not diverged:  # the closing line (a divergence says its own)
            loss = state.last_val_loss
            val = f"final val loss {loss:.4f}" if loss is not None else "no validation"
            log.info("done: %d steps, %s tokens, %s, %.0f s this session: %s", state.step,
                     f"{state.tokens or 0:,}", val, wall_seconds, out_dir)  # fmt: skip
    return summary
