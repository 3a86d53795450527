"""Train a GPT-2 with the optimizer chosen by config.

    python train.py                                   # tiny GPT on the embedded corpus, CPU
    python train.py optimizer=adamw max_steps=500     # any config key can be overridden
    torchrun --nproc_per_node=8 train.py model=gpt2-small data=openwebtext
    python train.py --multirun optimizer.lr=3e-4,6e-4,1e-3

Here is the run: Ctrl-C outside the loop (``interrupted``), the loop (``loop``: a step, then the
log line, validation loss and checkpoint at their intervals), one run from its directory to its
summary (``train``). The command line that runs it (Hydra, the checks of the overrides) is
``trainer/command_line.py``. Elsewhere, in ``trainer/``: the Trainer and its step
(``trainer.py``), the run directory and summary (``run.py``, ``rundir.py``), checkpoints
(``checkpoint.py``), what each step reports (``meter.py``); everything lands in ``out_dir``.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING


def interrupted(signum: int, frame) -> None:
    """Ctrl-C outside the training loop (imports, set-up, data, the end): one line, no
    traceback, exit 130; inside the loop trainer/preemption.py stops at the step instead."""
    if os.environ.get("RANK", "0") == "0":
        sys.stderr.write("interrupted (Ctrl-C) outside the training loop; nothing was lost since "
                         "the last checkpoint: run the same command again\n")  # fmt: skip
    # At once: an exception raised here could land inside an import, half done, and be caught
    # there; every file of a run is written atomically, so nothing is left half written.
    os._exit(130)  # 128 + SIGINT, as a shell reports it


# The training code (torch and everything above it) is imported where it is used: a command
# line with a misspelt key is refused before those seconds of imports (docs/input-checks.md).
if TYPE_CHECKING:
    from runtime.distributed import DistInfo
    from trainer.config import TrainConfig
    from trainer.trainer import Trainer

log = logging.getLogger("train")


def loop(trainer: Trainer) -> None:
    """The loop: a step, then at their intervals the log line, the validation loss and a
    checkpoint; a stop signal agreed by every rank ends it early with a checkpoint."""
    from trainer.meter import Meter

    cfg, state = trainer.cfg, trainer.state
    if state.step >= cfg.max_steps:
        log.info("run already complete at step %d (max_steps=%d)", state.step, cfg.max_steps)
        return
    if state.step == 0 and cfg.eval_every:
        trainer.evaluate()
    flops_per_token = trainer.raw_model.flops_per_token(cfg.sequence_length)
    if getattr(trainer.optimizer, "needs_reference_grad", False):
        flops_per_token *= 2  # exact mode: a second forward and backward per step (MFU counts it)
    meter = Meter(cfg, trainer.dist, state, trainer.logger, flops_per_token, trainer.elapsed)
    while state.step < cfg.max_steps:
        loss, grad_norm, lr = trainer.train_step()
        last = state.step == cfg.max_steps
        meter.step(grad_norm)
        if state.step % cfg.log_every == 0 or last:
            trainer.guard.resolve(trainer.logger)  # the device decision, read at once here
            if not trainer.guard.skipped:
                meter.log(loss, grad_norm, lr, trainer.guard.metrics())
        t0 = time.perf_counter()
        if (cfg.eval_every and state.step % cfg.eval_every == 0) or last:
            trainer.evaluate()
        stop = not last and trainer.preemption.stop_requested()  # agreed by all ranks
        if (cfg.ckpt_every and state.step % cfg.ckpt_every == 0) or last or stop:
            trainer.save()
        meter.exclude(time.perf_counter() - t0)
        if stop:
            trainer.stopped_by = trainer.preemption.signame
            break
    if not trainer.stopped_by:  # a run is finished only if its last state is finite
        check_final_state(trainer)
    if trainer.dcp_saver is not None:
        trainer.dcp_saver.close()  # the last checkpoint is written before the run ends
    meter.close()


def check_final_state(trainer: Trainer) -> None:
    """Raise Diverged where the run reached its budget in a state that is not finished
    (trainer.nonfinite's ``final_state_problem``): every rank reads the same answer."""
    from runtime import runfiles
    from runtime.distributed import broadcast_object
    from trainer.nonfinite import Diverged, final_state_problem

    state, why = trainer.state, None
    if trainer.dist.is_main:
        vals = [r["val_loss"] for r in runfiles.read_metrics(trainer.out_dir) if "val_loss" in r]
        first = float(vals[0]) if vals else None
        why = final_state_problem(state, first, trainer.cfg.model.vocab_size)
    why = broadcast_object(why)
    if why:
        raise Diverged(f"{trainer.out_dir} did not finish: {why}", state.step)


def train(cfg: TrainConfig, config_dict: dict) -> dict:
    """Run training as configured; returns the summary (also written to summary.json)."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    from runtime.distributed import destroy, init_distributed
    from trainer.logs import setup_logging

    dist = init_distributed(cfg.device)
    setup_logging(dist.is_main)
    try:
        with logging_redirect_tqdm():
            return _train(cfg, config_dict, dist)
    finally:
        destroy()


def _train(cfg: TrainConfig, config_dict: dict, dist: DistInfo) -> dict:
    from data import ensure_prepared
    from runtime.distributed import barrier
    from trainer.config import grad_accum_steps
    from trainer.run import on_main, prepare_out_dir

    grad_accum_steps(cfg, dist.world_size)  # fail on a bad batch before touching any file
    data = cfg.data  # prepared (the embedded corpus) and checked before the run directory
    on_main(dist, ensure_prepared, data.name, data.dir, data.tokenizer, data.val_fraction)
    barrier()
    on_main(dist, check_data, cfg)
    from trainer.command_line import default_run_dir

    name = cfg.out_dir if cfg.out_dir is not None else default_run_dir(cfg)
    out_dir, resume_path, lock = prepare_out_dir(name, cfg.resume, config_dict, dist)
    try:  # one process per run directory, until the run ends (trainer/runlock.py)
        return _run(cfg, {**config_dict, "out_dir": str(out_dir)}, dist, out_dir, resume_path)
    finally:
        lock.release()


def check_data(cfg: TrainConfig) -> None:
    """One line for shards that cannot feed the model (cut short, another format or tokenizer,
    tokens outside the vocabulary, a split without one window of seq_len+1 tokens:
    data.config.check_shards), before any file of the run."""
    from data.config import check_shards

    if why := check_shards(cfg.model.vocab_size, cfg.data, seq_len=cfg.sequence_length):
        raise SystemExit(f"data error: {why}")


def _run(cfg: TrainConfig, config_dict: dict, dist: DistInfo, out_dir: Path,
         resume_path: Path | None) -> dict:  # fmt: skip
    """The run in ``out_dir``, which this job holds: data, the Trainer, the loop, the summary.
    A run that diverges is recorded as such (a checkpoint and summary.json) before it stops."""
    from runtime.device import configure_backends
    from trainer.nonfinite import Diverged
    from trainer.preemption import Preempted, resume_command
    from trainer.run import finish_run
    from trainer.shared_fs import check_shared_files
    from trainer.trainer import build_trainer

    check_shared_files(dist, out_dir, cfg.data)  # several nodes: an error, not a hang
    configure_backends(dist.device, tf32=cfg.tf32)
    trainer = build_trainer(cfg, config_dict, dist, out_dir, resume_path)
    if trainer.finished is not None:  # a relaunched table or sweep: change nothing
        log.info("run already complete at step %d (max_steps=%d): %s", trainer.state.step,
                 cfg.max_steps, out_dir)  # fmt: skip
        return trainer.finished
    start = time.perf_counter()
    try:
        with trainer.preemption:  # the signal handlers, while the loop runs
            loop(trainer)
    except Diverged as stop:  # a state, not only a message: a rerun is refused until told
        trainer.record_divergence(stop)
        finish_run(cfg, dist, trainer.state, out_dir, parameters=trainer.raw_model.num_params(),
                   wall_seconds=time.perf_counter() - start, elapsed_s=trainer.elapsed(),
                   optimizer=trainer.optimizer)  # fmt: skip
        raise
    finally:
        trainer.logger.close()
    if trainer.stopped_by:  # checkpoint written; train.py exits with REQUEUE_EXIT_CODE
        raise Preempted(trainer.stopped_by, trainer.state.step, str(out_dir), resume_command())
    params, wall_s = trainer.raw_model.num_params(), time.perf_counter() - start
    return finish_run(cfg, dist, trainer.state, out_dir, parameters=params, wall_seconds=wall_s,
                      elapsed_s=trainer.elapsed(), optimizer=trainer.optimizer)  # fmt: skip


if __name__ == "__main__":
    signal.signal(signal.SIGINT, interrupted)  # before the imports, which take seconds
    # Run the importable module's copy, so Hydra's submitit launcher can pickle the run by
    # reference (a function of __main__ would be pickled with all its globals).
    import train
    from trainer.command_line import cli

    cli(train.train)
