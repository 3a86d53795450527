"""Train a GPT-2 with the optimizer chosen by config.

    python train.py                                   # tiny GPT on the embedded corpus, CPU
    python train.py optimizer=adamw max_steps=500     # any config key can be overridden
    torchrun --nproc_per_node=8 train.py model=gpt2-small data=openwebtext
    python train.py --multirun optimizer.lr=3e-4,6e-4,1e-3

Each step: set the lr from the schedule, forward/backward over the micro-batches (DDP syncs
gradients on the last one only), clip the global grad norm, step the optimizer. Validation loss,
checkpoints and logs at the configured intervals; everything lands in ``out_dir``.

Here: the step (``forward_backward``, ``Trainer``), building a ready Trainer, one run from start
to summary, and the command line (the only Hydra code of training). Elsewhere: the run directory,
save/restore and the summary (``trainer/run.py``), what each step reports (``trainer/meter.py``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import time
from pathlib import Path

import hydra
import torch
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm.contrib.logging import logging_redirect_tqdm

import optim
from data import TokenLoader, ensure_prepared, shard_files, val_batches
from model import GPT
from runtime.device import autocast, configure_backends, resolve_dtype
from runtime.distributed import (
    DistInfo,
    barrier,
    destroy,
    init_distributed,
    init_for_sweep,
    pick_device,
)
from runtime.seeding import seed_everything
from trainer import checks
from trainer.config import TrainConfig, grad_accum_steps
from trainer.dcp_checkpoint import DcpCheckpointer
from trainer.evaluation import validation_loss
from trainer.logs import MetricsLogger, setup_logging
from trainer.meter import Meter, log_val_loss
from trainer.nonfinite import NonFiniteGuard
from trainer.preemption import Preempted, PreemptionGuard
from trainer.run import (
    RunState,
    finish_run,
    finished_summary,
    on_main,
    open_run,
    prepare_out_dir,
    restore_training_state,
    save_training_state,
)
from trainer.rundir import run_dir_name
from trainer.sweeps import launch_time, record_swept_keys, sweep_dir, sweep_job_dir

log = logging.getLogger("train")


def forward_backward(model, batches, dist: DistInfo, dtype, scale: float) -> torch.Tensor:
    """Accumulate ``scale * loss`` gradients over ``batches``; DDP syncs on the last one only.

    Returns the mean loss over ``batches`` as a tensor (no host synchronisation)."""
    total = torch.zeros((), device=dist.device)
    for i, (x, y) in enumerate(batches):
        last = i == len(batches) - 1
        sync = contextlib.nullcontext() if last or not isinstance(model, DDP) else model.no_sync()
        with sync:
            with autocast(dist.device, dtype):
                _, loss = model(x, y)
            (loss * scale).backward()
        total += loss.detach()
    return total / len(batches)


class Trainer:
    """Everything one training run holds, and the loop over it (this module's docstring)."""

    def __init__(self, cfg: TrainConfig, config_dict: dict, dist: DistInfo, out_dir: Path):
        self.cfg, self.config_dict, self.dist, self.out_dir = cfg, config_dict, dist, out_dir
        self.accum = grad_accum_steps(cfg, dist.world_size)
        self.dtype = resolve_dtype(cfg.dtype, dist.device)
        seed_everything(cfg.seed)  # identical initial weights on every rank
        self.raw_model = GPT(cfg.model).to(dist.device)
        self.raw_model.loss_chunk_tokens = cfg.loss_chunk_tokens
        self.raw_model.activation_checkpointing = cfg.activation_checkpointing
        self.optimizer = optim.build_optimizer(self.raw_model, cfg.optimizer)
        optim.set_initial_lr(self.optimizer)
        train_files, self.val_files = shard_files(cfg.data)
        self.loader = TokenLoader(
            train_files,
            batch_size=cfg.micro_batch_size,
            seq_len=cfg.sequence_length,
            rank=dist.rank,
            world_size=dist.world_size,
            seed=cfg.seed,
            device=dist.device,
            sampling=cfg.data.sampling,
        )
        seed_everything(cfg.seed + dist.rank)  # dropout streams differ per rank
        self.state = RunState()
        self.guard = NonFiniteGuard(cfg.nonfinite, dist, self.state, out_dir, cfg.batch_tokens)
        self.logger: MetricsLogger | None = None  # opened by build_trainer
        self.finished: dict | None = None  # the summary, when an earlier session finished the run
        self.preemption = PreemptionGuard()  # SIGTERM/SIGUSR1: stop, checkpoint, requeue
        self.stopped_by = ""  # the signal that stopped the run early
        self.model: torch.nn.Module = self.raw_model  # compiled and/or DDP-wrapped in wrap()
        self.eval_model: torch.nn.Module = self.raw_model
        self.session_start = time.perf_counter()
        self.dcp_saver = (
            DcpCheckpointer(
                asynchronous=cfg.async_checkpoint, rank=dist.rank, world_size=dist.world_size
            )
            if cfg.checkpoint_format == "dcp"
            else None
        )

    def elapsed(self) -> float:
        """Wall-clock seconds since the run began, summed over its sessions."""
        return round(self.state.elapsed_s + time.perf_counter() - self.session_start, 3)

    def wrap(self) -> None:
        """torch.compile (optional), then DDP when there are several processes."""
        model = torch.compile(self.raw_model) if self.cfg.compile else self.raw_model
        self.eval_model = model
        if self.dist.distributed:
            cuda = self.dist.device.type == "cuda"
            model = DDP(model, device_ids=[self.dist.local_rank] if cuda else None)
        self.model = model

    def restore(self, path: Path) -> Path:
        """Load ``path`` (resume=auto: or the newest readable older one); returns the one used."""
        parts = (self.raw_model, self.optimizer, self.loader)
        fall_back = self.cfg.resume == "auto"
        return restore_training_state(path, *parts, self.state, self.dist, fall_back)

    def save(self) -> None:
        parts = (self.raw_model, self.optimizer, self.loader)
        save_training_state(self.out_dir, *parts, self.state, config=self.config_dict,
                            dist=self.dist, keep=self.cfg.keep_checkpoints, elapsed=self.elapsed,
                            dcp_saver=self.dcp_saver)  # fmt: skip

    def evaluate(self) -> float:
        cfg, dist = self.cfg, self.dist
        batches = val_batches(
            self.val_files,
            batch_size=cfg.micro_batch_size,
            seq_len=cfg.sequence_length,
            rank=dist.rank,
            world_size=dist.world_size,
            max_tokens=cfg.eval_tokens,
            device=dist.device,
        )
        loss = validation_loss(self.eval_model, batches, dist.device, self.dtype)
        log_val_loss(loss, self.state, self.logger, self.elapsed())
        return loss

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor, float]:
        """One optimizer step; returns (loss, grad norm) as tensors and the lr used. A step with
        a non-finite loss or gradient is skipped or stops the run (trainer/nonfinite.py)."""
        cfg = self.cfg
        lr = optim.apply_schedule(self.optimizer, self.state.step, cfg.schedule, cfg.max_steps)
        batches = [self.loader.next_batch() for _ in range(self.accum)]
        scale = cfg.grad_scale / self.accum
        ref_norm = self.reference_grad(scale)
        loss = forward_backward(self.model, batches, self.dist, self.dtype, scale)
        grad_norm = self.clip_grads()
        if self.guard.allows_step(loss, grad_norm, ref_norm, self.logger):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.state.step += 1
        self.state.tokens += cfg.batch_tokens
        return loss, grad_norm, lr

    def clip_grads(self) -> torch.Tensor:
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else math.inf
        return torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), max_norm)

    def reference_grad(self, scale: float) -> torch.Tensor | None:
        """Exact MARS through optim.reference_pass (a no-op for other optimizers): the gradient
        of the *next* step's batches at the current weights, clipped like the real one, kept by
        the optimizer as the next step's reference. Returns its norm (None when no pass ran)."""
        norms = []

        def ahead() -> None:
            batches = [self.loader.peek_batch(i) for i in range(self.accum)]
            forward_backward(self.model, batches, self.dist, self.dtype, scale)
            norms.append(self.clip_grads())

        optim.reference_pass(self.optimizer, ahead)
        return norms[0] if norms else None

    def run(self) -> None:
        cfg, state = self.cfg, self.state
        if state.step >= cfg.max_steps:
            log.info("run already complete at step %d (max_steps=%d)", state.step, cfg.max_steps)
            return
        if state.step == 0 and cfg.eval_every:
            self.evaluate()
        flops_per_token = self.raw_model.flops_per_token(cfg.sequence_length)
        meter = Meter(cfg, self.dist, state, self.logger, flops_per_token, self.elapsed)
        while state.step < cfg.max_steps:
            loss, grad_norm, lr = self.train_step()
            last = state.step == cfg.max_steps
            meter.step(grad_norm)
            if (state.step % cfg.log_every == 0 or last) and not self.guard.skipped:
                meter.log(loss, grad_norm, lr, self.guard.metrics())
            t0 = time.perf_counter()
            if (cfg.eval_every and state.step % cfg.eval_every == 0) or last:
                self.evaluate()
            stop = not last and self.preemption.stop_requested()  # agreed by all ranks
            if (cfg.ckpt_every and state.step % cfg.ckpt_every == 0) or last or stop:
                self.save()
            meter.exclude(time.perf_counter() - t0)
            if stop:
                self.stopped_by = self.preemption.signame
                break
        if self.dcp_saver is not None:
            self.dcp_saver.close()  # the last checkpoint is written before the run ends
        meter.close()


def build_trainer(
    cfg: TrainConfig, config_dict: dict, dist: DistInfo, out_dir: Path, resume_path: Path | None
) -> Trainer:
    """A ready Trainer: model, optimizer and loader built, the checkpoint restored, the run files
    and the logger open, the model compiled and DDP-wrapped. A run that an earlier session
    finished is only restored, with its summary in ``trainer.finished``: nothing is written."""
    trainer = Trainer(cfg, config_dict, dist, out_dir)
    if resume_path is not None:
        resume_path = trainer.restore(resume_path)
    trainer.finished = finished_summary(out_dir, trainer.state.step, cfg.max_steps)
    if trainer.finished is None:
        trainer.logger = open_run(cfg, config_dict, dist, out_dir, resume_path, trainer.state.step)
        trainer.wrap()
        log.info("model %s: %.2fM parameters | optimizer %s | %d process(es) on %s, %s | batch %s "
                 "tokens = %d seqs x %d tokens x %d micro-steps x %d processes | out_dir %s",
                 cfg.model.name, trainer.raw_model.num_params() / 1e6, cfg.optimizer.name,
                 dist.world_size, dist.device, str(trainer.dtype).removeprefix("torch."),
                 f"{cfg.batch_tokens:,}", cfg.micro_batch_size, cfg.sequence_length,
                 trainer.accum, dist.world_size, out_dir)  # fmt: skip
    return trainer


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
            trainer.run()
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
