"""The Trainer: everything one training run holds (model, optimizer, data position, counters,
policies) and one optimizer step over it. The loop over steps, and what happens between them
(logging, evaluation, checkpoints), is train.py's ``loop``.

One step: set the lr from the schedule, (exact MARS: the next batch's gradient at the current
weights, kept as the next step's reference), forward/backward over the micro-batches (DDP syncs
gradients on the last one only), clip the global grad norm, step the optimizer unless the
non-finite policy skips it (an optimizer whose step runs on the engine takes the clip into its
own kernels: optim/engine/clip.py).

Tools (bench/) build the same Trainer with their own batches (``batches=``) and no run directory.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import optim
from data import TokenLoader, shard_files, val_batches
from model import build_model
from runtime.attention import AttentionShape, configure_sdpa
from runtime.device import autocast, check_torch, resolve_dtype
from runtime.distributed import DistInfo, broadcast_object
from runtime.seeding import seed_everything
from trainer import checkpoint as ckpt
from trainer import fsdp
from trainer.config import TrainConfig, checkpointing, grad_accum_steps
from trainer.dcp_checkpoint import DcpCheckpointer
from trainer.evaluation import validation_loss
from trainer.logs import MetricsLogger
from trainer.meter import log_val_loss
from trainer.nonfinite import Diverged, NonFiniteGuard
from trainer.preemption import PreemptionGuard
from trainer.run import (
    DIVERGED,
    RunState,
    check_not_diverged,
    finished_summary,
    open_run,
    record_routes,
)

log = logging.getLogger("train")


def no_checkpoint_line(exc: ValueError, path: Path, fell_back: bool) -> str:
    """The one line of a resume whose checkpoint cannot be used: with resume=auto every
    checkpoint of the run was tried (and said why), with resume=PATH the one asked for."""
    if not fell_back:
        return f"resume={path}: {exc}"
    why = str(exc).split("; resume=auto falls back")[0]  # there is nothing left to fall back to
    return (
        f"no checkpoint of {path.parent.parent} can be used (the oldest: {why}); move "
        f"{path.parent} away to start the run over, or resume=never with another name=NAME"
    )


class MicroBatches:
    """A step's ``count`` micro-batches, each fetched (``fetch(i)``) only when the micro-step loop
    reaches it: the wait for the loader and the host-to-device copy of batch i+1 then come after
    micro-step i's work is queued on the GPU, not all before the first. Iterate once."""

    def __init__(self, fetch: Callable[[int], tuple[torch.Tensor, torch.Tensor]], count: int):
        self.fetch, self.count = fetch, count

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return (self.fetch(i) for i in range(self.count))


def forward_backward(model, batches, dist: DistInfo, dtype, scale: float) -> torch.Tensor:
    """Accumulate ``scale * loss`` gradients over ``batches`` (a list, or ``MicroBatches``);
    DDP and FSDP sync (all-reduce, reduce-scatter) on the last one only.

    Autocast stays on under FSDP: its bf16 blocks make it a no-op for their matmuls, and it
    keeps the LayerNorms, softmax and loss in float32 as in a DDP run; the residual stream is
    float32 under both (trainer/fsdp.py: shard_model).
    Returns the mean loss over ``batches`` as a tensor (no host synchronisation)."""
    total = torch.zeros((), device=dist.device)
    for i, (x, y) in enumerate(batches):
        last = i == len(batches) - 1
        sync = contextlib.nullcontext() if last or not isinstance(model, DDP) else model.no_sync()
        if fsdp.is_sharded(model):
            fsdp.set_gradient_sync(model, last)
        with sync:
            with autocast(dist.device, dtype):
                _, loss = model(x, y)
            (loss * scale).backward()
        total += loss.detach()
    return total / len(batches)


def regions_under_ddp() -> None:
    """Turn Dynamo's DDPOptimizer off for a model compiled region by region and then wrapped in
    DDP. Each block is already one graph, and DDP's reducer overlaps each bucket's all-reduce
    with the backward through its own hooks; DDPOptimizer would only cut the blocks further (DDP's
    small first bucket split the MLP: 5 graphs a block, bench/graphs.py). Off, every block runs as
    one graph, attention inside. It also avoids torch 2.5's DDPOptimizer failure on the chunked
    loss's autograd.Function (docs/gpu-readiness.md)."""
    if torch._dynamo.config.optimize_ddp:
        log.info("compiled regions under DDP: Dynamo's DDPOptimizer off (a graph per block)")
    torch._dynamo.config.optimize_ddp = False


def no_buffer_sync() -> dict:
    """DDP's keyword for "no buffer broadcast before every forward": the models' only buffers are
    constants (GPT-2's layer scale). torch 2.13 renamed ``broadcast_buffers`` (deprecated there)
    to ``forward_sync_buffers``."""
    import inspect

    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


DDP_DEFAULT_BUCKET_MB = 25.0
# DDP keeps .grad as views into its buckets: no second copy of the gradients (4 B/param); the
# memory model (trainer/memory_model.py) and the launcher read this value.
GRADIENT_AS_BUCKET_VIEW = True


def ddp_bucket_cap_mb(model: torch.nn.Module) -> float:
    """DDP's gradient bucket size: at least the gradients of the largest transformer block.

    Under torch.compile, DDPOptimizer cuts the model into one graph per bucket; with DDP's
    default 25 MB cap a GPT-2 XL block (123 MB of fp32 gradients) is cut into five, each a
    compile and a graph break. A cap of one block makes each piece at least a block; it never
    goes below the default, so small models keep DDP's usual overlap."""
    blocks = getattr(getattr(model, "transformer", None), "h", None) or []
    largest = max((sum(p.numel() * p.element_size() for p in b.parameters()) for b in blocks),
                  default=0)  # fmt: skip
    return max(DDP_DEFAULT_BUCKET_MB, largest / 2**20)


class Trainer:
    """One run's parts and its step (module docstring). ``batches`` replaces the token loader
    (anything with ``next_batch``, ``peek_batch``, ``state_dict``, ``load_state_dict``): the
    benchmarks train on random tokens without data files or a run directory."""

    def __init__(
        self, cfg: TrainConfig, dist: DistInfo, *, out_dir: Path | None = None,
        config_dict: dict | None = None, batches: Any = None,
    ) -> None:  # fmt: skip
        check_torch()  # one line naming the version found and needed, before any work
        self.cfg, self.dist = cfg, dist
        self.out_dir, self.config_dict = out_dir, config_dict or {}
        self.accum = grad_accum_steps(cfg, dist.world_size)
        self.dtype = resolve_dtype(cfg.dtype, dist.device)
        seed_everything(cfg.seed)  # identical initial weights on every rank
        self.raw_model = build_model(cfg.model).to(dist.device)
        self.raw_model.loss_chunk_tokens = cfg.loss_chunk_tokens
        self.raw_model.activation_checkpointing = cfg.activation_checkpointing
        # The attention kernel, before anything is compiled (runtime/attention.py); rank 0's
        # measurement on every rank, and no draw from the seeded generators.
        shape = AttentionShape.of_run(cfg.model, cfg.micro_batch_size, cfg.sequence_length,
                                      self.dtype)  # fmt: skip
        self.sdpa = configure_sdpa(cfg.sdpa_backend, dist.device, shape, broadcast_object)
        self.optimizer = optim.build_optimizer(self.raw_model, cfg.optimizer)
        optim.set_initial_lr(self.optimizer)
        self.val_files: list = []
        self.loader = batches if batches is not None else self._token_loader()
        seed_everything(cfg.seed + dist.rank)  # dropout streams differ per rank
        self.state = RunState()
        guard_dir = out_dir if out_dir is not None else Path(".")
        self.guard = NonFiniteGuard(cfg.nonfinite, dist, self.state, guard_dir, cfg.batch_tokens,
                                    optimizer=self.optimizer)  # fmt: skip
        self.logger: MetricsLogger | None = None  # opened by build_trainer
        self.finished: dict | None = None  # the summary, when an earlier session finished the run
        self.preemption = PreemptionGuard()  # SIGTERM/SIGUSR1: stop, checkpoint, requeue
        self.stopped_by = ""  # the signal that stopped the run early
        self.routes_recorded = False  # logged and in meta.jsonl after the first step (run.py)
        self.model: torch.nn.Module = self.raw_model  # compiled and/or DDP-wrapped in wrap()
        self.eval_model: torch.nn.Module = self.raw_model
        self.session_start = time.perf_counter()
        ckpt = checkpointing(cfg, dist.world_size)  # logged once here, in meta.jsonl (run.py)
        if dist.is_main:
            log.info("checkpoints: %s, %s (%s)", ckpt["format"],
                     "asynchronous" if ckpt["asynchronous"] else "synchronous", ckpt["why"])  # fmt: skip
        self.dcp_saver = (
            DcpCheckpointer(
                asynchronous=ckpt["asynchronous"], rank=dist.rank, world_size=dist.world_size
            )
            if ckpt["format"] == "dcp"
            else None
        )
        self.guard.settle_checkpoints = self._settle_checkpoints

    def _token_loader(self) -> TokenLoader:
        cfg, dist = self.cfg, self.dist
        train_files, self.val_files = shard_files(cfg.data)
        return TokenLoader(
            train_files,
            batch_size=cfg.micro_batch_size,
            seq_len=cfg.sequence_length,
            rank=dist.rank,
            world_size=dist.world_size,
            seed=cfg.seed,
            device=dist.device,
            sampling=cfg.data.sampling,
            # This step's micro-batches and the next step's (exact MARS reads them ahead), read
            # and pinned by the loader's thread while the GPU computes.
            prefetch=max(2, 2 * self.accum),
            fraction=cfg.data.train_fraction,
        )

    def elapsed(self) -> float:
        """Wall-clock seconds since the run began, summed over its sessions."""
        return round(self.state.elapsed_s + time.perf_counter() - self.session_start, 3)

    def wrap(self) -> None:
        """torch.compile (optional, in place, region by region), then, with several processes,
        DDP or (``parallel=fsdp``) FSDP2's sharding, after which the optimizer is rebuilt over
        the sharded parameters with its (restored) state sharded alike (trainer/fsdp.py)."""
        sharded = self.cfg.parallel == "fsdp" and self.dist.distributed
        ddp = self.dist.distributed and not sharded
        if self.cfg.compile and ddp:
            regions_under_ddp()
        model = self.raw_model
        if self.cfg.compile:
            # Region by region (GPT.compile_regions): one block compiled for all alike, not the
            # whole model traced at once. dynamic=False: every shape is fixed (validation batches
            # are padded to the micro-batch); a dynamic graph is slower and differs across ranks.
            # Before fully_shard, as torchtitan: FSDP's hooks stay outside the compiled blocks.
            model.compile_regions(dynamic=False)
        if self.cfg.parallel == "fsdp" and not sharded:
            log.info("parallel=fsdp with one process: nothing to shard, the plain model runs")
        if sharded:
            fsdp.shard_model(model, self.dist.device, self.dist.world_size, self.dtype)
            self.optimizer = fsdp.rebuild_optimizer(
                self.optimizer, lambda: optim.build_optimizer(model, self.cfg.optimizer)
            )
            self.guard.bind(self.optimizer)  # found_inf goes to the optimizer that steps
        elif ddp:
            cuda = self.dist.device.type == "cuda"
            model = DDP(
                model,
                device_ids=[self.dist.local_rank] if cuda else None,
                bucket_cap_mb=ddp_bucket_cap_mb(self.raw_model),
                gradient_as_bucket_view=GRADIENT_AS_BUCKET_VIEW,
                **no_buffer_sync(),
            )
        self.eval_model = self.raw_model  # under FSDP the sharded root: every rank runs it
        self.model = model

    def restore(self, path: Path) -> Path:
        """Load ``path`` (resume=auto: or the newest readable older one); returns the one used."""
        parts = (self.raw_model, self.optimizer, self.loader)
        fall_back = self.cfg.resume == "auto"
        try:
            used = ckpt.restore_training_state(path, *parts, self.state, self.dist, fall_back)
        except ValueError as exc:  # every checkpoint unreadable, or resume=PATH's: one line
            raise SystemExit(no_checkpoint_line(exc, path, fall_back)) from None
        check_not_diverged(self.state, self.cfg.nonfinite.resume_diverged, self.out_dir, used)
        optim.train_weights(self.optimizer)  # saved at the evaluated weights (schedule-free x)
        return used

    def save(self, prune: bool = True) -> None:
        """Checkpoint the run; ``prune=False`` keeps every older checkpoint (a diverged run's
        last one must not push out the good ones before it)."""
        self.guard.resolve(self.logger)  # a skip read late is counted before the state is saved
        parts = (self.raw_model, self.optimizer, self.loader)
        keep = self.cfg.keep_checkpoints if prune else 0
        with optim.eval_weights(self.optimizer, exact=False):  # x on disk; y as a resume has it
            ckpt.save_training_state(self.out_dir, *parts, self.state, config=self.config_dict,
                                     dist=self.dist, keep=keep, elapsed=self.elapsed,
                                     dcp_saver=self.dcp_saver)  # fmt: skip

    def _settle_checkpoints(self) -> None:
        """Wait for the asynchronous save in flight, so the stop message names it; a save that
        failed is logged here, and the message names the newest one that was committed."""
        if self.dcp_saver is None:
            return
        try:
            self.dcp_saver.wait()
        except SystemExit as failed:
            log.error("%s", failed)

    def record_divergence(self, stop: Diverged) -> None:
        """The run stopped for divergence at ``stop.step``: its failed step counted as a skipped
        one (its batch is consumed), the state saved as a checkpoint that says so (no older one
        pruned) and in summary.json (trainer/run.py: finish_run) by the caller."""
        self.state.tokens += (stop.step - self.state.step) * self.cfg.batch_tokens
        self.state.step = max(self.state.step, stop.step)
        self.state.stopped, self.state.stop_message = DIVERGED, stop.message
        self.save(prune=False)
        if self.dcp_saver is not None:
            self.dcp_saver.close()

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
        with optim.eval_weights(self.optimizer):  # schedule-free: at x, not at y
            loss = validation_loss(self.eval_model, batches, dist.device, self.dtype)
        if fsdp.is_sharded(self.eval_model):
            fsdp.reshard(self.eval_model)  # the root stays gathered after a forward alone
        log_val_loss(loss, self.state, self.logger, self.elapsed())
        return loss

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor, float]:
        """One optimizer step; returns (loss, grad norm) as tensors and the lr used. A step with
        a non-finite loss or gradient is skipped or stops the run (trainer/nonfinite.py)."""
        cfg = self.cfg
        lr = optim.apply_schedule(self.optimizer, self.state.step, cfg.schedule, cfg.max_steps)
        scale = cfg.grad_scale / self.accum
        ref_norm = self.reference_grad(scale, ahead=self.accum)  # the next step's batches
        batches = MicroBatches(lambda _: self.loader.next_batch(), self.accum)
        loss = forward_backward(self.model, batches, self.dist, self.dtype, scale)
        grad_norm = self.clip_grads()
        if self.guard.allows_step(loss, grad_norm, ref_norm, self.logger):
            self.optimizer.step()
        if not self.routes_recorded:
            self.routes_recorded = record_routes(self.optimizer, self.dist, self.out_dir)
        self.optimizer.zero_grad(set_to_none=True)
        self.state.step += 1
        self.state.tokens += cfg.batch_tokens
        return loss, grad_norm, lr

    def clip_grads(self) -> torch.Tensor:
        """Clip the global grad norm; returns the norm (a device tensor). Where the optimizer
        steps every gradient on its engine, the clip folds into it (optim/engine/clip.py): the
        norm is one more pass of its kernels, the scaling happens as its step reads each
        gradient (the gradients stay unscaled); else torch's ``clip_grad_norm_``."""
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else math.inf
        fold = getattr(self.optimizer, "fold_grad_clip", None)
        norm = fold(max_norm, self.raw_model.parameters()) if fold is not None else None
        if norm is not None:
            return norm
        # Under FSDP the gradients are DTensor shards: the norm is the whole model's (DTensor's
        # norm reduces over the ranks) and comes back as a DTensor, made a plain tensor here.
        norm = torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), max_norm)
        return fsdp.full_norm(norm)

    def reference_grad(self, scale: float, ahead: int = 0) -> torch.Tensor | None:
        """Exact MARS through optim.reference_pass (a no-op for other optimizers): the gradient
        of the *next* step's batches at the current weights, clipped like the real one, kept by
        the optimizer as the next step's reference. ``ahead``: the batches still to be taken
        before the next step's (``train_step`` runs this before taking its own ``accum``).
        Returns its norm (None when no pass ran)."""
        norms = []

        def pass_ahead() -> None:
            batches = MicroBatches(lambda i: self.loader.peek_batch(ahead + i), self.accum)
            forward_backward(self.model, batches, self.dist, self.dtype, scale)
            norms.append(self.clip_grads())

        optim.reference_pass(self.optimizer, pass_ahead)
        return norms[0] if norms else None


def build_trainer(
    cfg: TrainConfig, config_dict: dict, dist: DistInfo, out_dir: Path, resume_path: Path | None
) -> Trainer:
    """A ready Trainer: model, optimizer and loader built, the checkpoint restored, the run files
    and the logger open, the model compiled and DDP-wrapped. A run that an earlier session
    finished is only restored, with its summary in ``trainer.finished``: nothing is written."""
    trainer = Trainer(cfg, dist, out_dir=out_dir, config_dict=config_dict)
    if resume_path is not None:
        resume_path = trainer.restore(resume_path)
    trainer.finished = finished_summary(out_dir, trainer.state.step, cfg.max_steps)
    if trainer.finished is None:
        trainer.logger = open_run(cfg, config_dict, dist, out_dir, resume_path, trainer.state.step,
                                  sdpa=trainer.sdpa)  # fmt: skip
        trainer.wrap()
        log.info("model %s: %.2fM parameters | optimizer %s | %d process(es) on %s, %s | batch %s "
                 "tokens = %d seqs x %d tokens x %d micro-steps x %d processes | out_dir %s",
                 cfg.model.name, trainer.raw_model.num_params() / 1e6, cfg.optimizer.name,
                 dist.world_size, dist.device, str(trainer.dtype).removeprefix("torch."),
                 f"{cfg.batch_tokens:,}", cfg.micro_batch_size, cfg.sequence_length,
                 trainer.accum, dist.world_size, out_dir)  # fmt: skip
    return trainer
