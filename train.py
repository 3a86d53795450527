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
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import hydra
import torch
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
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
from runtime.device import autocast, peak_flops, resolve_dtype
from runtime.distributed import (
    DistInfo,
    all_reduce_sum,
    barrier,
    broadcast_object,
    destroy,
    gather_objects,
    init_distributed,
)
from runtime.evaluation import validation_loss
from runtime.logs import MetricsLogger, init_wandb, setup_logging, truncate_metrics
from runtime.rundir import check_run_dir, default_out_dir, write_run_files, write_summary
from runtime.seeding import seed_everything

log = logging.getLogger("train")


@dataclass
class RunState:
    step: int = 0  # completed optimizer steps
    tokens: int = 0
    best_val_loss: float | None = None
    last_val_loss: float | None = None
    last_train_loss: float | None = None


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

    Returns the sum of the scaled losses as a tensor (no host synchronisation)."""
    total = torch.zeros((), device=dist.device)
    for i, (x, y) in enumerate(batches):
        last = i == len(batches) - 1
        sync = contextlib.nullcontext() if last or not isinstance(model, DDP) else model.no_sync()
        with sync:
            with autocast(dist.device, dtype):
                _, loss = model(x, y)
            (loss * scale).backward()
        total += loss.detach() * scale
    return total


def build(cfg: TrainConfig, dist: DistInfo):
    """Model, optimizer, loader, and the checkpoint to resume from (loaded, or None)."""
    seed_everything(cfg.seed)  # identical initial weights on every rank
    model = GPT(cfg.model).to(dist.device)
    optimizer = optim.build_optimizer(model, cfg.optimizer)
    optim.set_initial_lr(optimizer)
    train_files, _ = shard_files(cfg.data)
    loader = TokenLoader(
        train_files,
        batch_size=cfg.micro_batch_size,
        seq_len=cfg.sequence_length,
        rank=dist.rank,
        world_size=dist.world_size,
        seed=cfg.seed,
        device=dist.device,
    )
    seed_everything(cfg.seed + dist.rank)  # dropout streams differ per rank
    return model, optimizer, loader


def restore(path: Path, model, optimizer, loader, state: RunState, dist: DistInfo) -> None:
    c = ckpt.load_checkpoint(path)
    ckpt.load_model_state(model, c["model"], str(path))
    optimizer.load_state_dict(c["optimizer"])
    loader.load_state_dict(c["loader"])
    state.step, state.tokens = c["step"], c.get("tokens", 0)
    state.best_val_loss = c.get("best_val_loss")
    if len(c["rng"]) == dist.world_size:
        ckpt.set_rng_state(c["rng"][dist.rank], dist.device)
    else:
        log.warning(
            "checkpoint has RNG states for %d ranks, not %d: reseeding",
            len(c["rng"]),
            dist.world_size,
        )
    log.info("resumed from %s at step %d (%s tokens)", path, state.step, f"{state.tokens:,}")


def save(cfg, out_dir, raw_model, optimizer, loader, state: RunState, config_dict, dist) -> None:
    rngs = gather_objects(ckpt.rng_state(dist.device))  # a collective: every rank calls it
    if dist.is_main:
        payload = {
            "model": raw_model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "loader": loader.state_dict(),
            "rng": rngs,
            "config": config_dict,
            "tokens": state.tokens,
            "best_val_loss": state.best_val_loss,
        }
        path = ckpt.save_checkpoint(out_dir, state.step, payload, cfg.keep_checkpoints)
        log.info("saved %s", path)
    barrier()


def evaluate(cfg: TrainConfig, model, dist: DistInfo, dtype, state: RunState, logger) -> None:
    _, val_files = shard_files(cfg.data)
    batches = val_batches(
        val_files,
        batch_size=cfg.micro_batch_size,
        seq_len=cfg.sequence_length,
        rank=dist.rank,
        world_size=dist.world_size,
        max_tokens=cfg.eval_tokens,
        device=dist.device,
    )
    loss = validation_loss(model, batches, dist.device, dtype)
    state.last_val_loss = loss
    if state.best_val_loss is None or loss < state.best_val_loss:
        state.best_val_loss = loss
    logger.log(
        {
            "step": state.step,
            "tokens": state.tokens,
            "val_loss": loss,
            "val_ppl": math.exp(min(loss, 50.0)),
        }
    )
    log.info("step %d | val loss %.4f", state.step, loss)


def prepare_out_dir(
    cfg: TrainConfig, config_dict: dict, dist: DistInfo
) -> tuple[Path, Path | None]:
    name = cfg.out_dir or default_out_dir()
    if cfg.out_dir is None and HydraConfig.initialized():
        hc = HydraConfig.get()
        if hc.mode == RunMode.MULTIRUN:
            name = f"{name}_{hc.job.num}"
    out_dir = Path(broadcast_object(name))  # rank 0's choice: every rank uses the same directory
    resume_path = ckpt.resolve_resume(cfg.resume, out_dir)
    config_dict = {**config_dict, "out_dir": str(out_dir)}
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
    accum = grad_accum_steps(cfg, dist.world_size)
    out_dir, resume_path = prepare_out_dir(cfg, config_dict, dist)
    config_dict = {**config_dict, "out_dir": str(out_dir)}
    on_main(dist, ensure_prepared, cfg.data.name, cfg.data.dir)
    barrier()
    dtype = resolve_dtype(cfg.dtype, dist.device)
    if dist.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    raw_model, optimizer, loader = build(cfg, dist)
    state = RunState()
    if resume_path is not None:
        restore(resume_path, raw_model, optimizer, loader, state, dist)
    if dist.is_main:
        write_run_files(
            out_dir,
            config_dict,
            {
                "world_size": dist.world_size,
                "device": str(dist.device),
                "resume_from": str(resume_path) if resume_path else None,
            },
        )
        truncate_metrics(out_dir, state.step)
    wandb_run = init_wandb(cfg.wandb, out_dir, config_dict) if dist.is_main else None
    logger = MetricsLogger(out_dir, enabled=dist.is_main, wandb_run=wandb_run)
    model = torch.compile(raw_model) if cfg.compile else raw_model
    if dist.distributed:
        model = DDP(model, device_ids=[dist.local_rank] if dist.device.type == "cuda" else None)
    eval_model = model.module if isinstance(model, DDP) else model
    log.info(
        "model %s: %.2fM parameters | optimizer %s | %d rank(s) on %s, %s | batch %s "
        "tokens = %d x %d seqs x %d micro-steps x %d ranks",
        cfg.model.name,
        raw_model.num_params() / 1e6,
        cfg.optimizer.name,
        dist.world_size,
        dist.device,
        str(dtype).removeprefix("torch."),
        f"{cfg.batch_tokens:,}",
        cfg.sequence_length,
        cfg.micro_batch_size,
        accum,
        dist.world_size,
    )
    try:
        if state.step >= cfg.max_steps:
            log.info("run already complete at step %d (max_steps=%d)", state.step, cfg.max_steps)
        else:
            if state.step == 0 and cfg.eval_every:
                evaluate(cfg, eval_model, dist, dtype, state, logger)
            loop(
                cfg,
                model,
                raw_model,
                eval_model,
                optimizer,
                loader,
                state,
                accum,
                dtype,
                out_dir,
                config_dict,
                dist,
                logger,
            )
    finally:
        logger.close()
    summary = {
        "steps": state.step,
        "tokens": state.tokens,
        "final_train_loss": state.last_train_loss,
        "final_val_loss": state.last_val_loss,
        "best_val_loss": state.best_val_loss,
        "parameters": raw_model.num_params(),
        "optimizer": cfg.optimizer.name,
        "model": cfg.model.name,
        "world_size": dist.world_size,
        "out_dir": str(out_dir),
    }
    if dist.is_main:
        write_summary(out_dir, summary)
    return summary


def loop(
    cfg,
    model,
    raw_model,
    eval_model,
    optimizer,
    loader,
    state,
    accum,
    dtype,
    out_dir,
    config_dict,
    dist,
    logger,
) -> None:
    flops_per_step = raw_model.flops_per_token(cfg.sequence_length) * cfg.batch_tokens
    peak = peak_flops(dist.device)
    bar = tqdm(
        total=cfg.max_steps,
        initial=state.step,
        disable=not (dist.is_main and cfg.progress),
        unit="step",
        dynamic_ncols=True,
    )
    params = [p for p in raw_model.parameters() if p.requires_grad]
    max_norm = cfg.grad_clip if cfg.grad_clip > 0 else math.inf
    t_last, steps_since = time.perf_counter(), 0
    clipped = torch.zeros((), device=dist.device)
    while state.step < cfg.max_steps:
        lr = optim.apply_schedule(optimizer, state.step, cfg.schedule, cfg.max_steps)
        batches = [loader.next_batch() for _ in range(accum)]
        loss = forward_backward(model, batches, dist, dtype, 1.0 / accum)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        clipped += (grad_norm > max_norm).float()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state.step += 1
        state.tokens += cfg.batch_tokens
        steps_since += 1
        bar.update(1)
        last = state.step == cfg.max_steps
        if state.step % cfg.log_every == 0 or last:
            train_loss = (all_reduce_sum(loss) / dist.world_size).item()
            if not math.isfinite(train_loss):
                raise FloatingPointError(f"train loss is {train_loss} at step {state.step}")
            dt = time.perf_counter() - t_last
            tok_s = steps_since * cfg.batch_tokens / dt
            mfu = flops_per_step * steps_since / dt / (peak * dist.world_size) if peak else None
            state.last_train_loss = train_loss
            logger.log(
                {
                    "step": state.step,
                    "tokens": state.tokens,
                    "train_loss": train_loss,
                    "lr": lr,
                    "grad_norm": grad_norm.item(),
                    "clip_rate": clipped.item() / state.step,
                    "tokens_per_s": tok_s,
                    "mfu": mfu,
                }
            )
            bar.set_postfix(loss=f"{train_loss:.4f}", tok_s=f"{tok_s:,.0f}", refresh=False)
            eta = (cfg.max_steps - state.step) * dt / steps_since
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
            t_last, steps_since = time.perf_counter(), 0
        if (cfg.eval_every and state.step % cfg.eval_every == 0) or last:
            evaluate(cfg, eval_model, dist, dtype, state, logger)
            t_last = time.perf_counter()
        if (cfg.ckpt_every and state.step % cfg.ckpt_every == 0) or last:
            save(cfg, out_dir, raw_model, optimizer, loader, state, config_dict, dist)
            t_last = time.perf_counter()
    bar.close()


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


register_schemas()


@hydra.main(version_base=None, config_path="configs", config_name="config")
def main(cfg: DictConfig) -> None:
    typed, as_dict = to_typed(cfg)
    train(typed, as_dict)


if __name__ == "__main__":
    main()
