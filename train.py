"""Train a GPT-2 with the optimizer chosen by config.

    python train.py                                   # tiny GPT on the embedded corpus, CPU
    python train.py optimizer=adamw max_steps=500     # any config key can be overridden
    torchrun --nproc_per_node=8 train.py model=gpt2-small data=openwebtext
    python train.py --multirun optimizer.lr=3e-4,6e-4,1e-3

Each step: set the lr from the schedule, forward/backward over the micro-batches (DDP syncs
gradients on the last one only), clip the global grad norm, step the optimizer. Validation loss,
checkpoints and logs at the configured intervals; everything lands in ``out_dir``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import hydra
import torch
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

import optim
from data import TokenLoader, ensure_prepared, shard_files, val_batches
from model import GPT
from runtime import checkpoint as ckpt
from runtime.config import TrainConfig
from runtime.device import autocast, peak_flops, resolve_dtype, tune_host_allocator
from runtime.distributed import (
    DistInfo,
    all_reduce_sum,
    barrier,
    broadcast_object,
    destroy,
    gather_objects,
    init_distributed,
    init_for_sweep,
)
from runtime.evaluation import validation_loss
from runtime.logs import MetricsLogger, init_wandb, setup_logging, truncate_metrics
from runtime.rundir import check_run_dir, run_dir_name, write_run_files, write_summary
from runtime.seeding import seed_everything
from runtime.sweeps import launch_time, record_swept_keys, sweep_dir, sweep_job_dir

log = logging.getLogger("train")


@dataclass
class RunState:
    step: int = 0  # completed optimizer steps
    tokens: int = 0
    best_val_loss: float | None = None
    last_val_loss: float | None = None
    last_train_loss: float | None = None
    elapsed_s: float = 0.0  # wall-clock seconds of the run's earlier sessions (restarts)


def on_main(dist: DistInfo, fn, *args):
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


def grad_accum_steps(cfg: TrainConfig, world_size: int) -> int:
    per_micro = cfg.micro_batch_size * cfg.sequence_length * world_size
    if cfg.batch_tokens % per_micro:
        raise SystemExit(
            f"batch_tokens={cfg.batch_tokens} is not a multiple of micro_batch_size "
            f"({cfg.micro_batch_size}) x seq_len ({cfg.sequence_length}) x world size "
            f"({world_size}) = {per_micro}; pick batch_tokens as a multiple of {per_micro}"
        )
    return cfg.batch_tokens // per_micro


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
        self.logger: MetricsLogger | None = None
        self.model: torch.nn.Module = self.raw_model  # compiled and/or DDP-wrapped in wrap()
        self.eval_model: torch.nn.Module = self.raw_model
        self.session_start = time.perf_counter()

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

    def restore(self, path: Path) -> None:
        c = ckpt.load_checkpoint(path)
        ckpt.load_model_state(self.raw_model, c["model"], str(path))
        self.optimizer.load_state_dict(c["optimizer"])
        self.loader.load_state_dict(c["loader"])
        self.state.step, self.state.tokens = c["step"], c.get("tokens", 0)
        self.state.best_val_loss = c.get("best_val_loss")
        self.state.elapsed_s = c.get("elapsed_s", 0.0)
        if len(c["rng"]) == self.dist.world_size:
            ckpt.set_rng_state(c["rng"][self.dist.rank], self.dist.device)
        else:
            n = len(c["rng"])
            log.warning(
                "checkpoint has RNG states of %d ranks, not %d: reseeding", n, self.dist.world_size
            )
        log.info(
            "resumed from %s at step %d (%s tokens)",
            path,
            self.state.step,
            f"{self.state.tokens:,}",
        )

    def save(self) -> None:
        rngs = gather_objects(ckpt.rng_state(self.dist.device))  # a collective: every rank
        if self.dist.is_main:
            payload = {
                "model": self.raw_model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "loader": self.loader.state_dict(),
                "rng": rngs,
                "config": self.config_dict,
                "tokens": self.state.tokens,
                "best_val_loss": self.state.best_val_loss,
                "elapsed_s": self.elapsed(),
            }
            path = ckpt.save_checkpoint(
                self.out_dir, self.state.step, payload, self.cfg.keep_checkpoints
            )
            log.info("saved %s", path)
        barrier()

    def evaluate(self) -> float:
        cfg, dist, state = self.cfg, self.dist, self.state
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
        state.last_val_loss = loss
        if state.best_val_loss is None or loss < state.best_val_loss:
            state.best_val_loss = loss
        ppl = math.exp(min(loss, 50.0))
        record = {"step": state.step, "tokens": state.tokens, "val_loss": loss, "val_ppl": ppl}
        self.logger.log({**record, "elapsed_s": self.elapsed()})
        log.info("step %d | val loss %.4f | val ppl %.2f", state.step, loss, ppl)
        return loss

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor, float]:
        """One optimizer step; returns (loss, grad norm) as tensors and the lr used."""
        cfg = self.cfg
        lr = optim.apply_schedule(self.optimizer, self.state.step, cfg.schedule, cfg.max_steps)
        batches = [self.loader.next_batch() for _ in range(self.accum)]
        scale = cfg.grad_scale / self.accum
        self.reference_grad(scale)
        loss = forward_backward(self.model, batches, self.dist, self.dtype, scale)
        grad_norm = self.clip_grads()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.state.step += 1
        self.state.tokens += cfg.batch_tokens
        return loss, grad_norm, lr

    def clip_grads(self) -> torch.Tensor:
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else math.inf
        return torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), max_norm)

    def reference_grad(self, scale: float) -> None:
        """Exact MARS through optim.reference_pass (a no-op for other optimizers): the gradient
        of the *next* step's batches at the current weights, clipped like the real one, kept by
        the optimizer as the next step's reference."""

        def ahead() -> None:
            batches = [self.loader.peek_batch(i) for i in range(self.accum)]
            forward_backward(self.model, batches, self.dist, self.dtype, scale)
            self.clip_grads()

        optim.reference_pass(self.optimizer, ahead)

    def run(self) -> None:
        cfg, state = self.cfg, self.state
        if state.step >= cfg.max_steps:
            log.info("run already complete at step %d (max_steps=%d)", state.step, cfg.max_steps)
            return
        if state.step == 0 and cfg.eval_every:
            self.evaluate()
        meter = Meter(self, peak_flops(self.dist.device))
        while state.step < cfg.max_steps:
            loss, grad_norm, lr = self.train_step()
            last = state.step == cfg.max_steps
            meter.step(grad_norm)
            if state.step % cfg.log_every == 0 or last:
                meter.log(loss, grad_norm, lr)
            t0 = time.perf_counter()
            if (cfg.eval_every and state.step % cfg.eval_every == 0) or last:
                self.evaluate()
            if (cfg.ckpt_every and state.step % cfg.ckpt_every == 0) or last:
                self.save()
            meter.exclude(time.perf_counter() - t0)
        meter.close()


class Meter:
    """Throughput, MFU, clip rate, ETA and the progress bar (host syncs only at log steps)."""

    def __init__(self, trainer: Trainer, peak: float | None) -> None:
        self.t, cfg = trainer, trainer.cfg
        flops_per_token = trainer.raw_model.flops_per_token(cfg.sequence_length)
        self.flops_per_step = flops_per_token * cfg.batch_tokens
        self.peak = peak * trainer.dist.world_size if peak else None
        show = trainer.dist.is_main and cfg.progress
        self.bar = tqdm(
            total=cfg.max_steps,
            initial=trainer.state.step,
            disable=not show,
            unit="step",
            dynamic_ncols=True,
        )
        self.clipped = torch.zeros((), device=trainer.dist.device)
        self.steps_done = 0  # steps taken by this process (for the clip rate)
        self.since, self.t0 = 0, time.perf_counter()

    def step(self, grad_norm: torch.Tensor) -> None:
        clip = self.t.cfg.grad_clip
        if clip > 0:
            self.clipped += (grad_norm > clip).float()
        self.steps_done += 1
        self.since += 1
        self.bar.update(1)

    def exclude(self, seconds: float) -> None:
        """Leave time spent on evals and checkpoints out of the throughput."""
        self.t0 += seconds

    def log(self, loss: torch.Tensor, grad_norm: torch.Tensor, lr: float) -> None:
        t, cfg, state = self.t, self.t.cfg, self.t.state
        train_loss = (all_reduce_sum(loss) / t.dist.world_size).item()
        if not math.isfinite(train_loss):
            raise FloatingPointError(f"train loss is {train_loss} at step {state.step}")
        dt = time.perf_counter() - self.t0
        tok_s = self.since * cfg.batch_tokens / dt
        mfu = self.flops_per_step * self.since / dt / self.peak if self.peak else None
        state.last_train_loss = train_loss
        t.logger.log(
            {
                "step": state.step,
                "tokens": state.tokens,
                "train_loss": train_loss,
                "lr": lr,
                "grad_norm": grad_norm.item(),
                "clip_rate": self.clipped.item() / self.steps_done,
                "tokens_per_s": tok_s,
                "mfu": mfu,
                "elapsed_s": t.elapsed(),
            }
        )
        eta = (cfg.max_steps - state.step) * dt / self.since
        self.bar.set_postfix(loss=f"{train_loss:.4f}", tok_s=f"{tok_s:,.0f}", refresh=False)
        log.info(
            "step %d/%d | loss %.4f | lr %.2e | %s tok/s%s | eta %s",
            state.step,
            cfg.max_steps,
            train_loss,
            lr,
            f"{tok_s:,.0f}",
            f" | mfu {100 * mfu:.1f}%" if mfu else "",
            _hms(eta),
        )
        self.since, self.t0 = 0, time.perf_counter()

    def close(self) -> None:
        self.bar.close()


def prepare_out_dir(
    cfg: TrainConfig, config_dict: dict, dist: DistInfo
) -> tuple[Path, Path | None]:
    """The run directory (rank 0's choice, shared by all) and the checkpoint to resume from.

    ``out_dir`` if given; in a ``--multirun`` sweep the job's directory under the sweep's parent
    (``hydra.sweep.dir``/``subdir`` in configs/config.yaml); otherwise
    ``runs/<name>[_<overrides>]_<launch time>``."""
    name = cfg.out_dir
    if name is None and HydraConfig.initialized():
        hc = HydraConfig.get()
        if hc.mode == RunMode.MULTIRUN:
            name = hc.runtime.output_dir
        else:
            name = run_dir_name(cfg.name or cfg.optimizer.name, hc.overrides.task, launch_time())
    elif name is None:
        name = run_dir_name(cfg.name or cfg.optimizer.name, [], launch_time())
    out_dir = Path(broadcast_object(name))
    resume_path = ckpt.resolve_resume(cfg.resume, out_dir)
    on_main(dist, check_run_dir, out_dir, config_dict, resume_path is not None)
    return out_dir, resume_path


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
    out_dir, resume_path = prepare_out_dir(cfg, config_dict, dist)
    config_dict = {**config_dict, "out_dir": str(out_dir)}
    on_main(dist, ensure_prepared, cfg.data.name, cfg.data.dir)
    barrier()
    if dist.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    elif dist.device.type == "cpu":
        tune_host_allocator()
    trainer = Trainer(cfg, config_dict, dist, out_dir)
    if resume_path is not None:
        trainer.restore(resume_path)
    summary_path = out_dir / "summary.json"
    if trainer.state.step >= cfg.max_steps and summary_path.exists():
        # A finished run started again (a relaunched table or sweep): change nothing.
        log.info("run already complete at step %d (max_steps=%d): %s", trainer.state.step,
                 cfg.max_steps, out_dir)  # fmt: skip
        return json.loads(summary_path.read_text())
    wandb_run = None
    if dist.is_main:
        meta = {
            "world_size": dist.world_size,
            "device": str(dist.device),
            "resume_from": str(resume_path) if resume_path else None,
        }
        write_run_files(out_dir, config_dict, meta)
        truncate_metrics(out_dir, trainer.state.step)
        wandb_run = init_wandb(cfg.wandb, out_dir, config_dict, cfg.name)
    trainer.logger = MetricsLogger(out_dir, enabled=dist.is_main, wandb_run=wandb_run)
    trainer.wrap()
    log.info(
        "model %s: %.2fM parameters | optimizer %s | %d process(es) on %s, %s | batch %s tokens"
        " = %d seqs x %d tokens x %d micro-steps x %d processes | out_dir %s",
        cfg.model.name,
        trainer.raw_model.num_params() / 1e6,
        cfg.optimizer.name,
        dist.world_size,
        dist.device,
        str(trainer.dtype).removeprefix("torch."),
        f"{cfg.batch_tokens:,}",
        cfg.micro_batch_size,
        cfg.sequence_length,
        trainer.accum,
        dist.world_size,
        out_dir,
    )
    start = time.perf_counter()
    try:
        trainer.run()
    finally:
        trainer.logger.close()
    state = trainer.state
    summary = {
        "steps": state.step,
        "tokens": state.tokens,
        "final_train_loss": state.last_train_loss,
        "final_val_loss": state.last_val_loss,
        "best_val_loss": state.best_val_loss,
        "parameters": trainer.raw_model.num_params(),
        "model": cfg.model.name,
        "optimizer": cfg.optimizer.name,
        "world_size": dist.world_size,
        "wall_seconds_this_session": round(time.perf_counter() - start, 1),
        "elapsed_s": trainer.elapsed(),
        "out_dir": str(out_dir),
    }
    if dist.is_main:
        write_summary(out_dir, summary)
    return summary


def _hms(seconds: float) -> str:
    seconds = int(seconds)
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
        if seconds >= 3600
        else (f"{seconds // 60}m{seconds % 60:02d}s")
    )


def register_schemas() -> None:
    """Typed schemas: the top level, and one per registered optimizer (``base_<name>``)."""
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=TrainConfig)
    for name in optim.available():
        cs.store(group="optimizer", name=f"base_{name}", node=optim.get_spec(name).config_cls)


def to_typed(cfg: DictConfig) -> tuple[TrainConfig, dict]:
    """The composed config as dataclasses (validated) and as a plain dict (for saving)."""
    try:
        optim.get_spec(cfg.optimizer.name)
        typed = OmegaConf.to_object(cfg)
    except ValueError as exc:
        raise SystemExit(f"config error: {exc}") from None
    return typed, OmegaConf.to_container(cfg, resolve=True)


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


@hydra.main(version_base=None, config_path=str(Path(__file__).parent / "configs"), config_name="config")
def main(cfg: DictConfig) -> None:
    typed, as_dict = to_typed(cfg)
    try:
        train(typed, as_dict)
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
