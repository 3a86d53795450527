"""Train a GPT-2 with the optimizer chosen by config.

    python train.py                                   # tiny GPT on the embedded corpus, CPU
    python train.py optimizer=adamw max_steps=500     # any config key can be overridden
    torchrun --nproc_per_node=8 train.py model=gpt2-small data=openwebtext
    python train.py --multirun optimizer.lr=3e-4,6e-4,1e-3

Here: the loop (``loop``: a step, then the log line, validation loss and checkpoint at their
intervals), one run from its directory to its summary (``train``), and the command line (the only
Hydra code of training). Elsewhere, in ``trainer/``: the Trainer and its step (``trainer.py``),
the run directory and summary (``run.py``, ``rundir.py``), checkpoints (``checkpoint.py``), what
each step reports (``meter.py``); everything lands in ``out_dir``.
"""

from __future__ import annotations

import contextlib
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


if __name__ == "__main__":  # before the imports below, which take seconds
    signal.signal(signal.SIGINT, interrupted)

import hydra  # noqa: E402
from hydra.core.config_store import ConfigStore  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from hydra.core.override_parser.overrides_parser import OverridesParser  # noqa: E402
from hydra.errors import HydraException  # noqa: E402
from hydra.types import RunMode  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402
from omegaconf.errors import OmegaConfBaseException  # noqa: E402

from trainer.cli_checks import (  # noqa: E402
    Override,
    check_train_overrides,
    from_parsed,
    group_options,
    override_args,
    stray_words,
)

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


def default_run_dir(cfg: TrainConfig) -> str:
    """Where a run without ``out_dir`` goes: in a ``--multirun`` sweep the job's directory under
    the sweep's parent (``hydra.sweep.dir``/``subdir`` in configs/config.yaml); otherwise
    ``runs/<name>[_<overrides>]``. No time stamp: the same command, the same directory, so
    running a stopped command again continues its run (docs/failures.md)."""
    from trainer.rundir import run_dir_name

    name = cfg.name or cfg.optimizer.name
    try:
        if not HydraConfig.initialized():
            return run_dir_name(name, [])
        hc = HydraConfig.get()
        if hc.mode == RunMode.MULTIRUN:
            return hc.runtime.output_dir
        return run_dir_name(name, list(hc.overrides.task))
    except ValueError as exc:  # a name that leaves runs/ (name=../../x)
        raise SystemExit(f"config error: {exc}") from None


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
                   routes=optim_routes(trainer.optimizer))  # fmt: skip
        raise
    finally:
        trainer.logger.close()
    if trainer.stopped_by:  # checkpoint written; train.py exits with REQUEUE_EXIT_CODE
        raise Preempted(trainer.stopped_by, trainer.state.step, str(out_dir), resume_command())
    params, wall_s = trainer.raw_model.num_params(), time.perf_counter() - start
    return finish_run(cfg, dist, trainer.state, out_dir, parameters=params, wall_seconds=wall_s,
                      elapsed_s=trainer.elapsed(), routes=optim_routes(trainer.optimizer))  # fmt: skip


def optim_routes(optimizer) -> dict:  # noqa: ANN001
    """The routes the optimizer's buckets took in its last step (optim/routes.py)."""
    from optim.routes import taken

    return taken(optimizer)


def register_schemas() -> None:
    """Typed schemas: the top level, and one per registered optimizer in group
    ``schema/optimizer``, which configs/optimizer/*.yaml extend (``/schema/optimizer/<name>@_here_``);
    kept out of group ``optimizer``, so that only real optimizers can be chosen there. Also the
    resolvers of configs/config.yaml (sweep directories, the groups of ``--help``)."""
    import optim
    from trainer.config import TrainConfig
    from trainer.sweeps import sweep_dir, sweep_job_dir

    cs = ConfigStore.instance()
    cs.store(name="base_config", node=TrainConfig)
    for name in optim.available():
        cs.store(group="schema/optimizer", name=name, node=optim.get_spec(name).config_cls)
    OmegaConf.register_new_resolver("sweep_dir", sweep_dir, replace=True)
    OmegaConf.register_new_resolver("sweep_job_dir", sweep_job_dir, replace=True)
    OmegaConf.register_new_resolver("config_groups", config_groups, replace=True)


def config_groups() -> str:
    """The groups a user chooses from and their options, for ``--help``."""
    from trainer.cli_checks import GROUPS

    return "\n".join(f"{g}: {', '.join(group_options(g))}" for g in GROUPS)


def to_typed(cfg: DictConfig) -> tuple[TrainConfig, dict]:
    """The composed config as dataclasses and as a plain dict (for saving), every value checked
    (trainer/checks.py; docs/input-checks.md): a bad one exits with one line, before any file."""
    import optim
    from runtime.device import resolve_dtype
    from runtime.distributed import pick_device
    from trainer import checks
    from trainer.config import TrainConfig

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


def compose_typed(overrides: list[str]) -> tuple[TrainConfig, dict]:
    """The config a ``python train.py OVERRIDES`` command line runs, composed without starting
    Hydra's app (for tools that replay a recorded command: bench/vr_probe.py)."""
    from hydra import compose, initialize_config_dir

    register_schemas()
    with initialize_config_dir(config_dir=str(Path(__file__).parent / "configs"),
                               version_base=None):  # fmt: skip
        return to_typed(compose(config_name="config", overrides=list(overrides)))


def check_command_line(args: list[str]) -> list[Override]:
    """The overrides of ``args``, each naming a real key, group and option; otherwise exit with
    one line (``config error: unknown config key max_step (did you mean max_steps?)``). Made
    before torch is imported, so that a typo is refused in about a second."""
    if stray := stray_words(args):
        raise SystemExit(f"config error: {stray}")
    try:
        overrides = from_parsed(OverridesParser.create().parse_overrides(override_args(args)))
        check_train_overrides(overrides)
    except (ValueError, HydraException) as exc:
        raise SystemExit(f"config error: {str(exc).strip().splitlines()[0]}") from None
    return overrides


def check_composition(overrides: list[str]) -> None:
    """Compose the config once as Hydra is about to, so that what Hydra would report in five lines
    (a value of the wrong type: ``max_steps=many``) ends the command with one."""
    from hydra import compose, initialize_config_dir

    from trainer.cli_checks import replaced_key

    ours = [o for o in overrides if not o.lstrip("+~").startswith("hydra")]
    try:
        with initialize_config_dir(config_dir=str(Path(__file__).parent / "configs"),
                                   version_base=None):  # fmt: skip
            compose(config_name="config", overrides=ours)
    except (HydraException, OmegaConfBaseException) as exc:
        cause = exc.__cause__ if isinstance(exc.__cause__, OmegaConfBaseException) else exc
        key = getattr(cause, "full_key", None)
        line = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        if key and (replaced := replaced_key(key)):  # an earlier version's key in a YAML file
            raise SystemExit(f"config error: {replaced}") from None
        raise SystemExit(f"config error: {f'{key}: ' if key else ''}{line}") from None


def remove_empty_job_dir(out_dir: str | None) -> None:
    """A sweep job given its own ``out_dir`` leaves Hydra's job directory empty: remove it."""
    if out_dir is None or not HydraConfig.initialized():
        return
    hc = HydraConfig.get()
    job_dir = Path(hc.runtime.output_dir)
    if hc.mode == RunMode.MULTIRUN and job_dir.resolve() != Path(out_dir).resolve():
        with contextlib.suppress(OSError):  # not empty, or already removed by another rank
            job_dir.rmdir()


@hydra.main(
    version_base=None, config_path=str(Path(__file__).parent / "configs"), config_name="config"
)
def main(cfg: DictConfig) -> None:
    from trainer import checks
    from trainer.preemption import Preempted

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


def skip_hydras_group_listing() -> None:
    """``--help``: configs/config.yaml's help template lists the groups a user chooses itself
    (``${config_groups:}``), but Hydra builds its own listing of every group for the template's
    ``$APP_CONFIG_GROUPS`` and ``$HYDRA_CONFIG_GROUPS`` first, used or not, walking the whole
    config tree: about 10 s of CPU of the 11 that ``--help`` took. Our template uses neither, so
    that listing is empty here (``--hydra-help`` keeps it). Left as it is where Hydra has no
    such method."""
    from hydra._internal.hydra import Hydra

    if hasattr(Hydra, "format_config_groups"):
        Hydra.format_config_groups = lambda self, predicate, compact=True: ""


def cli() -> None:
    """The command line. Under torchrun, one process group serves the whole process, so
    ``--multirun`` runs every job of a sweep over it, in the same order on every rank."""
    overrides = check_command_line(sys.argv[1:])
    if not any(o.swept for o in overrides):
        check_composition([a for a in sys.argv[1:] if "=" in a and not a.startswith("-")])
    from runtime.distributed import destroy, init_for_sweep
    from trainer.sweeps import record_swept_keys

    # Jobs that Hydra's submitit launcher starts (Slurm or local) import this project by name,
    # from whatever directory they start in.
    root = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    )
    record_swept_keys([o.key for o in overrides if o.swept])
    if {"--help", "-h"} & set(sys.argv[1:]):
        skip_hydras_group_listing()
    owns_group = init_for_sweep()
    try:
        main()
    finally:
        if owns_group:
            destroy(force=True)


if __name__ == "__main__":
    from trainer.cli_checks import TRAIN_PATH_KEYS, quote_paths

    # run dirs hold '=' and ','; out_dir may be swept with a comma
    sys.argv[1:] = quote_paths(sys.argv[1:], TRAIN_PATH_KEYS, sweepable=("out_dir",))
    check_command_line(sys.argv[1:])  # before the slow imports: a typo is refused at once
    # Run the importable module's copy, so Hydra's submitit launcher can pickle the task
    # function by reference (a function of __main__ would be pickled with all its globals).
    import train as _train

    _train.cli()
else:
    register_schemas()
