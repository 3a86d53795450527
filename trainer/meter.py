"""What the training loop reports: per step, throughput, MFU, clip rate, ETA and the progress bar
(``Meter``); per evaluation, the validation loss (``log_val_loss``).

Host synchronisation happens only at log steps: between them the clip count stays a tensor on
the device. Time spent on evaluations and checkpoints is left out of the throughput, and so is
each session's first step (it holds torch.compile's compilation): the timing window starts after
it, once the GPU has finished that step's queued work (one synchronisation, the only one outside
the log steps), and a log line before any timed step reports no tokens/s, MFU or ETA. The progress bar is
drawn only on a terminal: redirected to a file, its carriage returns would clutter the log, which
has the same numbers every ``log_every`` steps.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable

import torch
from tqdm import tqdm

from runtime.device import peak_flops
from runtime.distributed import DistInfo, all_reduce_sum
from trainer.config import TrainConfig
from trainer.logs import MetricsLogger
from trainer.run import RunState

log = logging.getLogger(__name__)


class Meter:
    """Throughput, MFU, clip rate, ETA and the progress bar (host syncs only at log steps)."""

    def __init__(
        self,
        cfg: TrainConfig,
        dist: DistInfo,
        state: RunState,
        logger: MetricsLogger,
        flops_per_token: float,
        elapsed: Callable[[], float],
    ) -> None:
        self.cfg, self.dist, self.state = cfg, dist, state
        self.logger, self.elapsed = logger, elapsed
        self.flops_per_step = flops_per_token * cfg.batch_tokens
        peak = peak_flops(dist.device)
        self.peak = peak * dist.world_size if peak else None
        self.bar = tqdm(
            total=cfg.max_steps,
            initial=state.step,
            disable=not (dist.is_main and cfg.progress and _is_terminal(sys.stderr)),
            unit="step",
            dynamic_ncols=True,
        )
        self.clipped = torch.zeros((), device=dist.device)
        self.steps_done = 0  # steps taken by this process (for the clip rate)
        self.since, self.t0 = 0, time.perf_counter()

    def step(self, grad_norm: torch.Tensor) -> None:
        clip = self.cfg.grad_clip
        if clip > 0:
            self.clipped += (grad_norm > clip).float()
        self.steps_done += 1
        self.since += 1
        if self.steps_done == 1:  # compilation and warm-up: start the timing window after it
            # Step 1's kernels may still be queued on the GPU; without a wait here the first
            # window would pay for them and report too few tokens/s. Once, so no sync per step.
            sync_device(self.dist.device)
            self.since, self.t0 = 0, time.perf_counter()
        self.bar.update(1)

    def exclude(self, seconds: float) -> None:
        """Leave time spent on evals and checkpoints out of the throughput."""
        self.t0 += seconds

    def log(
        self, loss: torch.Tensor, grad_norm: torch.Tensor, lr: float, extra: dict | None = None
    ) -> None:
        """Log the mean train loss over ranks, lr, grad norm, clip rate, tokens/s, MFU, ETA, and
        the keys of ``extra`` (e.g. ``skipped_steps``)."""
        cfg, state = self.cfg, self.state
        train_loss = (all_reduce_sum(loss) / self.dist.world_size).item()
        if not math.isfinite(train_loss):
            raise FloatingPointError(f"train loss is {train_loss} at step {state.step}")
        dt = time.perf_counter() - self.t0
        timed = self.since > 0  # not on the first step: it holds the compilation
        tok_s = self.since * cfg.batch_tokens / dt if timed else None
        mfu = self.flops_per_step * self.since / dt / self.peak if self.peak and timed else None
        state.last_train_loss = train_loss
        self.logger.log(
            {
                "step": state.step,
                "tokens": state.tokens,
                "train_loss": train_loss,
                "lr": lr,
                "grad_norm": grad_norm.item(),
                "clip_rate": self.clipped.item() / self.steps_done,
                "tokens_per_s": tok_s,
                "mfu": mfu,
                "elapsed_s": self.elapsed(),
                **(extra or {}),
            }
        )
        eta = hms((cfg.max_steps - state.step) * dt / self.since) if timed else "-"
        tok_text = f"{tok_s:,.0f}" if timed else "-"
        self.bar.set_postfix(loss=f"{train_loss:.4f}", tok_s=tok_text, refresh=False)
        log.info(
            "step %d/%d | loss %.4f | lr %.2e | %s tok/s%s | eta %s",
            state.step,
            cfg.max_steps,
            train_loss,
            lr,
            tok_text,
            f" | mfu {100 * mfu:.1f}%" if mfu else "",
            eta,
        )
        self.since, self.t0 = 0, time.perf_counter()

    def close(self) -> None:
        self.bar.close()


def sync_device(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (CUDA); nothing elsewhere (CPU work is done when
    its call returns)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _is_terminal(stream) -> bool:  # noqa: ANN001
    """Whether ``stream`` is a terminal (a progress bar's carriage returns belong there only)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # replaced or closed streams
        return False


def log_val_loss(loss: float, state: RunState, logger: MetricsLogger, elapsed_s: float) -> None:
    """Record a validation loss in the run's counters (last and best), metrics and console."""
    state.last_val_loss = loss
    if state.best_val_loss is None or loss < state.best_val_loss:
        state.best_val_loss = loss
    ppl = math.exp(min(loss, 50.0))
    record = {"step": state.step, "tokens": state.tokens, "val_loss": loss, "val_ppl": ppl}
    logger.log({**record, "elapsed_s": elapsed_s})
    log.info("step %d | val loss %.4f | val ppl %.2f", state.step, loss, ppl)


def hms(seconds: float) -> str:
    """``1h02m`` from an hour up, ``3m07s`` below."""
    seconds = int(seconds)
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
        if seconds >= 3600
        else (f"{seconds // 60}m{seconds % 60:02d}s")
    )
