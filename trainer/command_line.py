"""train.py's command line, the only Hydra code of training: the names checked before torch is
imported (``check_command_line``, on ``trainer/cli_checks.py``), the values' types checked by
composing the config (``check_composition``), the typed schemas and resolvers Hydra composes
with (``register_schemas``), the composed config as checked dataclasses (``to_typed``;
``compose_typed`` for tools that replay a recorded command), and Hydra's app (``cli``) running
the run that train.py hands it (``train.train``) as its task (``Job``).

The command line is checked once (``cli``), before anything slow is imported. A command that
sweeps nothing is composed twice: once here (``check_composition``) and once by Hydra's app.
Hydra's ``@hydra.main`` composes the config itself from ``sys.argv`` and takes no composed
config from outside, while its run directory, its ``--cfg``/``--help``/``--multirun`` and the
``HydraConfig`` that names a run's directory come only from that app; and a composition that
fails inside the app is printed by Hydra in five lines and exits before any code of ours runs.
So the first composition (about 0.1-0.4 s) is what turns that failure into one line
(docs/input-checks.md); the second is Hydra's own.

The trainer room imports no ``train.py``: train.py passes its run function in (``cli(run)``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from trainer.cli_checks import (
    GROUPS,
    TRAIN_PATH_KEYS,
    Override,
    check_train_overrides,
    from_parsed,
    group_options,
    override_args,
    quote_paths,
    replaced_key,
    stray_words,
)

# The training code (torch and everything above it) is imported where it is used: a command
# line with a misspelt key is refused before those seconds of imports (docs/input-checks.md).
if TYPE_CHECKING:
    from trainer.config import TrainConfig

    Run = Callable[[TrainConfig, dict], dict]

ROOT = Path(__file__).parent.parent  # the repository: train.py's directory
CONFIG_DIR = str(ROOT / "configs")
log = logging.getLogger("train")


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
    Hydra's app (for tools that replay a recorded command: study/findings/vr_probe.py)."""
    from hydra import compose, initialize_config_dir

    register_schemas()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
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

    register_schemas()
    ours = [o for o in overrides if not o.lstrip("+~").startswith("hydra")]
    try:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
            compose(config_name="config", overrides=ours)
    except (HydraException, OmegaConfBaseException) as exc:
        cause = exc.__cause__ if isinstance(exc.__cause__, OmegaConfBaseException) else exc
        key = getattr(cause, "full_key", None)
        line = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        if key and (replaced := replaced_key(key)):  # an earlier version's key in a YAML file
            raise SystemExit(f"config error: {replaced}") from None
        raise SystemExit(f"config error: {f'{key}: ' if key else ''}{line}") from None


def default_run_dir(cfg: TrainConfig) -> str:
    """Where a run without ``out_dir`` goes: in a ``--multirun`` sweep the job's directory under
    the sweep's parent (``hydra.sweep.dir``/``subdir`` in configs/config.yaml); otherwise
    ``runs/<name>[_<overrides>]``. No time stamp: the same command, the same directory, so
    running a stopped command again continues its run (docs/failures.md)."""
    from trainer.rundir import run_dir_name

    name = cfg.name or cfg.optimizer.name
    sweep_job_dir, overrides = hydra_job()
    if sweep_job_dir is not None:
        return sweep_job_dir
    try:
        return run_dir_name(name, overrides)
    except ValueError as exc:  # a name that leaves runs/ (name=../../x)
        raise SystemExit(f"config error: {exc}") from None


def hydra_job() -> tuple[str | None, list[str]]:
    """What Hydra's app says of the job, for a run without ``out_dir`` (``default_run_dir``):
    the job's directory in a ``--multirun`` sweep (else None) and the command line's overrides
    (none outside Hydra's app)."""
    if not HydraConfig.initialized():
        return None, []
    hc = HydraConfig.get()
    if hc.mode == RunMode.MULTIRUN:
        return hc.runtime.output_dir, []
    return None, list(hc.overrides.task)


def remove_empty_job_dir(out_dir: str | None) -> None:
    """A sweep job given its own ``out_dir`` leaves Hydra's job directory empty: remove it."""
    if out_dir is None or not HydraConfig.initialized():
        return
    hc = HydraConfig.get()
    job_dir = Path(hc.runtime.output_dir)
    if hc.mode == RunMode.MULTIRUN and job_dir.resolve() != Path(out_dir).resolve():
        with contextlib.suppress(OSError):  # not empty, or already removed by another rank
            job_dir.rmdir()


class Job:
    """Hydra's task: the composed config made typed and checked, then ``run`` (train.train).
    It wraps ``run`` (``functools.update_wrapper``), so Hydra names the job after it (``train``,
    ``hydra.job.name``). Hydra's submitit launcher pickles it into jobs in other processes:
    ``run`` by reference, and unpickling registers the schemas and resolvers that the job's
    own composition of its sweep directory needs (``__reduce__``)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        functools.update_wrapper(self, run)

    def __reduce__(self) -> tuple:
        return _unpickled_job, (self.run,)

    def __call__(self, cfg: DictConfig) -> None:
        from trainer import checks
        from trainer.preemption import Preempted

        if HydraConfig.get().mode == RunMode.MULTIRUN:  # Hydra's record of the sweep's command
            checks.redact_file(Path(HydraConfig.get().sweep.dir) / "multirun.yaml")
        typed, as_dict = to_typed(cfg)
        try:
            self.run(typed, as_dict)
        except Preempted as stop:
            if os.environ.get("RANK", "0") == "0":  # one line, for people and requeue scripts
                log.warning("%s", stop)
            raise
        finally:
            remove_empty_job_dir(typed.out_dir)


def _unpickled_job(run: Run) -> Job:
    register_schemas()
    return Job(run)


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


def cli(run: Run) -> None:
    """The command line of train.py, running ``run`` (train.train, from the importable module
    ``train``: the submitit launcher pickles it by reference). The names are checked first,
    before torch is imported. Under torchrun, one process group serves the whole process, so
    ``--multirun`` runs every job of a sweep over it, in the same order on every rank."""
    # run dirs hold '=' and ','; out_dir may be swept with a comma
    sys.argv[1:] = quote_paths(sys.argv[1:], TRAIN_PATH_KEYS, sweepable=("out_dir",))
    overrides = check_command_line(sys.argv[1:])  # a typo is refused at once
    if any(o.swept for o in overrides):
        register_schemas()
    else:
        check_composition([a for a in sys.argv[1:] if "=" in a and not a.startswith("-")])
    from runtime.distributed import destroy, init_for_sweep
    from trainer.sweeps import record_swept_keys

    # Jobs that Hydra's submitit launcher starts (Slurm or local) import this project by name,
    # from whatever directory they start in.
    root = str(ROOT.resolve())
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    )
    record_swept_keys([o.key for o in overrides if o.swept])
    if {"--help", "-h"} & set(sys.argv[1:]):
        skip_hydras_group_listing()
    owns_group = init_for_sweep()
    main = hydra.main(version_base=None, config_path=CONFIG_DIR, config_name="config")(Job(run))
    try:
        main()
    finally:
        if owns_group:
            destroy(force=True)
