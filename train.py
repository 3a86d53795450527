"""Train a GPT-2 with the optimizer chosen by config.

    python train.py                                   # tiny GPT on the embedded corpus, CPU
    python train.py optimizer=adamw max_steps=500     # any config key can be overridden
    torchrun --nproc_per_node=8 train.py model=gpt2-small data=openwebtext
    python train.py --multirun optimizer.lr=3e-4,6e-4,1e-3

Here: the loop (``run``: a step, then the log line, validation loss and checkpoint at their
intervals), one run from its directory to its summary (``train``), and the command line (the only
Hydra code of training). Elsewhere, in ``trainer/``: the Trainer and its step (``trainer.py``),
the run directory and summary (``run.py``, ``rundir.py``), checkpoints (``checkpoint.py``), what
each step reports (``meter.py``); everything lands in ``out_dir``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from tqdm.contrib.logging import logging_redirect_tqdm

import optim
from data import ensure_prepared
from runtime.device import configure_backends, resolve_dtype
from runtime.distributed import (
    DistInfo,
    barrier,
    destroy,
    init_distributed,
    init_for_sweep,
    pick_device,
)
from trainer import checks
from trainer.config import TrainConfig, grad_accum_steps
from trainer.logs import setup_logging
from trainer.meter import Meter
from trainer.preemption import Preempted
from trainer.run import finish_run, on_main, prepare_out_dir
from trainer.rundir import run_dir_name
from trainer.sweeps import launch_time, record_swept_keys, sweep_dir, sweep_job_dir
from trainer.trainer import Trainer, build_trainer

log = logging.getLogger("train")


def run(trainer: Trainer) -> None:
    """The loop: a step, then at their intervals the log line, the validation loss and a
    checkpoint; a stop signal agreed by every rank ends it early with a checkpoint."""
    cfg, state = trainer.cfg, trainer.state
    if state.step >= cfg.max_steps:
        log.info("run already complete at step %d (max_steps=%d)", state.step, cfg.max_steps)
        return
    if state.step == 0 and cfg.eval_every:
        trainer.evaluate()
    flops_per_token = trainer.raw_model.flops_per_token(cfg.sequence_length)
    meter = Meter(cfg, trainer.dist, state, trainer.logger, flops_per_token, trainer.elapsed)
    while state.step < cfg.max_steps:
        loss, grad_norm, lr = trainer.train_step()
        last = state.step == cfg.max_steps
        meter.step(grad_norm)
        if (state.step % cfg.log_every == 0 or last) and not trainer.guard.skipped:
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
    if trainer.dcp_saver is not None:
        trainer.dcp_saver.close()  # the last checkpoint is written before the run ends
    meter.close()


def default_run_dir(cfg: TrainConfig) -> str:
    """Where a run without ``out_dir`` goes: in a ``--multirun`` sweep the job's directory under
    the sweep's parent (``hydra.sweep.dir``/``subdir`` in configs/config.yaml); otherwise
    ``runs/<name>[_<overrides>]_<launch time>``."""
    name = cfg.name or cfg.optimizer.name
    if not HydraConfig.initialized():
        return run_dir_name(name, [], launch_time())
    hc = HydraConfig.get()
    if hc.mode == RunMode.MULTIRUN:
        return hc.runtime.output_dir
    return run_dir_name(name, hc.overrides.task, launch_time())


def train(cfg: TrainConfig, config_dict: dict) -> dict:
    """Run training as configured; returns the summary (also written to summary.json)."""
    dist = init_distributed(cfg.device)
    setup_logging(dist.is_main)
    try:
        with logging_redirect_tqdm():
            return _train(cfg, config_dict, dist)
    finally:
        destroy()


def _train(cfg: TrainConfig, config_dict: dict, dist: DistInfo) -> dict:
    grad_accum_steps(cfg, dist.world_size)  # fail on a bad batch before touching any file
    name = cfg.out_dir if cfg.out_dir is not None else default_run_dir(cfg)
    out_dir, resume_path = prepare_out_dir(name, cfg.resume, config_dict, dist)
    config_dict = {**config_dict, "out_dir": str(out_dir)}
    on_main(dist, ensure_prepared, cfg.data.name, cfg.data.dir)
    barrier()
    configure_backends(dist.device)
    trainer = build_trainer(cfg, config_dict, dist, out_dir, resume_path)
    if trainer.finished is not None:  # a relaunched table or sweep: change nothing
        log.info("run already complete at step %d (max_steps=%d): %s", trainer.state.step,
                 cfg.max_steps, out_dir)  # fmt: skip
        return trainer.finished
    start = time.perf_counter()
    try:
        with trainer.preemption:  # the signal handlers, while the loop runs
            run(trainer)
    finally:
        trainer.logger.close()
    if trainer.stopped_by:  # checkpoint written; train.py exits with REQUEUE_EXIT_CODE
        raise Preempted(trainer.stopped_by, trainer.state.step, str(out_dir))
    params, wall_s = trainer.raw_model.num_params(), time.perf_counter() - start
    return finish_run(cfg, dist, trainer.state, out_dir, parameters=params, wall_seconds=wall_s,
                      elapsed_s=trainer.elapsed())  # fmt: skip


def register_schemas() -> None:
    """Typed schemas: the top level, and one per registered optimizer in group
    ``schema/optimizer``, which configs/optimizer/*.yaml extend (``/schema/optimizer/<name>@_here_``);
    kept out of group ``optimizer``, so that only real optimizers can be chosen there."""
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=TrainConfig)
    for name in optim.available():
        cs.store(group="schema/optimizer", name=name, node=optim.get_spec(name).config_cls)


def to_typed(cfg: DictConfig) -> tuple[TrainConfig, dict]:
    """The composed config as dataclasses and as a plain dict (for saving), every value checked
    (trainer/checks.py; docs/input-checks.md): a bad one exits with one line, before any file."""
    try:
        values = OmegaConf.to_container(cfg, resolve=True)
        name = cfg.optimizer.name
        chosen = OmegaConf.get_type(cfg.optimizer)
        schema = checks.optimizer_schema(chosen, name, optim.get_spec(name))
        checks.check_known_keys(values, TrainConfig, {"optimizer": schema})
        typed = OmegaConf.to_object(cfg)
        checks.check_values(typed, values)
        resolve_dtype(typed.dtype, pick_device(typed.device, 0))
        checks.check_resume_source(typed.resume, values)
    except (ValueError, FileNotFoundError, OmegaConfBaseException) as exc:
        raise SystemExit(f"config error: {exc}") from None
    return typed, checks.redact(values)


def remove_empty_job_dir(out_dir: str | None) -> None:
    """A sweep job given its own ``out_dir`` leaves Hydra's job directory empty: remove it."""
    if out_dir is None or not HydraConfig.initialized():
        return
    hc = HydraConfig.get()
    job_dir = Path(hc.runtime.output_dir)
    if hc.mode == RunMode.MULTIRUN and job_dir.resolve() != Path(out_dir).resolve():
        with contextlib.suppress(OSError):  # not empty, or already removed by another rank
            job_dir.rmdir()


register_schemas()
OmegaConf.register_new_resolver("launch_time", launch_time, use_cache=True, replace=True)
OmegaConf.register_new_resolver("sweep_dir", sweep_dir, replace=True)
OmegaConf.register_new_resolver("sweep_job_dir", sweep_job_dir, replace=True)


@hydra.main(
    version_base=None, config_path=str(Path(__file__).parent / "configs"), config_name="config"
)
def main(cfg: DictConfig) -> None:
    if HydraConfig.get().mode == RunMode.MULTIRUN:  # Hydra's record of the sweep's command line
        checks.redact_file(Path(HydraConfig.get().sweep.dir) / "multirun.yaml")
    typed, as_dict = to_typed(cfg)
    try:
        train(typed, as_dict)
    except Preempted as stop:
        if os.environ.get("RANK", "0") == "0":  # one line, for people and requeue scripts
            log.warning("%s", stop)
        raise
    finally:
        remove_empty_job_dir(typed.out_dir)


def cli() -> None:
    """The command line. Under torchrun, one process group serves the whole process, so
    ``--multirun`` runs every job of a sweep over it, in the same order on every rank."""
    # Jobs that Hydra's submitit launcher starts (Slurm or local) import this project by name,
    # from whatever directory they start in.
    root = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    )
    overrides = [a for a in sys.argv[1:] if "=" in a and not a.startswith("-")]
    parsed = OverridesParser.create().parse_overrides(overrides)
    record_swept_keys([o.key_or_group for o in parsed if o.is_sweep_override()])
    owns_group = init_for_sweep()
    try:
        main()
    finally:
        if owns_group:
            destroy(force=True)


if __name__ == "__main__":
    # Run the importable module's copy, so Hydra's submitit launcher can pickle the task
    # function by reference (a function of __main__ would be pickled with all its globals).
    import train as _train

    _train.cli()
