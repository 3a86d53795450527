"""Non-finite loss or gradients: detect them once per step, agree on every rank, skip or stop.

Detection. One fused check per step, not one per parameter: the global gradient norm that the
loop already computes for clipping (``clip_grad_norm_``, or the optimizer engine's norm pass where
the clip folds into it: optim/engine/clip.py) is finite iff every gradient is (up to
gradients above ~1e19, whose squares overflow: a diverging step, skipped too), plus this rank's
loss, plus (exact MARS) the norm of the reference pass's gradient, which would otherwise become
the next step's ``g_ref``. The three flags of every rank are summed by one all-reduce of three
numbers, so every rank takes the same decision even when only one rank's loss is NaN (DDP
averages gradients, so a NaN gradient of one rank already reaches all; the loss is per rank).

Where the decision is read (``decision``). ``host``: the flags are read on the host
(``.tolist()``) every step and the optimizer step is simply not called: this keeps the state of
*any* optimizer untouched (Python-int step counters included), at the price of one host
synchronisation per step (the host waits for the backward pass before it launches the optimizer
step; ``python -m bench.nonfinite`` measures it). ``device``: torch's grad-scaler protocol. The
flag goes to the optimizer as ``optimizer.found_inf`` (a 0-d tensor, 1 = skip) and the step is
always called; an optimizer that supports it writes nothing where the flag is set, with no host
read (torch's fused AdamW; the core's compiled step, optim/compiled.py, masking every write with
``torch.where``; the core's eager paths, Newton-Schulz and the rest, stepping on copies that are
committed under the flag, optim/masked.py, at the cost of one copy of what they write). The host reads the flags one step late: a non-blocking copy made after the
backward pass is read during the next step, after that step's forward and backward are queued,
so the host never waits on queued work; a skip is then counted and reported, the core's host
step counters are taken back (``uncount_last_step``), and a stop raised, before the next
optimizer step. The log steps and checkpoints read it at once (they synchronise anyway).
``auto`` (default): ``device`` on CUDA when the optimizer supports it with no copies (every tensor
on the compiled path, or torch's fused AdamW), else ``host``; the choice and its reason are
logged once.

What a skipped step does (``skip``): the optimizer is not stepped, so the weights and the
optimizer state (moments, per-tensor step counts and bias corrections, MARS's ``last_grad``) are
never touched by a NaN/inf. The batch is consumed and ``step``, ``tokens``, the data position
and the lr schedule advance as if the step had been taken with a zero update: step numbers,
checkpoints and the schedule stay aligned with a run without skips, and a retried batch cannot
fail again. Exact MARS: the reference pass of the skipped step has already written the
*next* reference into the scratch buffer ``previous_grad``; the next step's reference pass
overwrites it before anything reads it, and the step after a skip uses the last applied step's
``last_grad`` (so for that one step the correction is approx mode's: one batch and one update
apart). Skipped steps are counted (``skipped_steps`` in ``metrics.jsonl``, the checkpoint and
``summary.json``), each gets a metrics record ``{"skipped": 1, ...}`` and a warning.

Stopping. ``skip`` stops at ``max_consecutive`` non-finite steps in a row, ``stop`` at the
first, with a message naming the step and the newest checkpoint, and exit status 1 on every rank
(the decision is the same on all, so no rank waits on another). The weights are never
non-finite, but a run whose loss stays non-finite is diverging or broken: restart from the
checkpoint with a lower lr, or look at the data at that step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from runtime.distributed import DistInfo, all_reduce_sum
from trainer.checkpoint import latest_checkpoint

log = logging.getLogger(__name__)

POLICIES = ("skip", "stop", "off")
DECISIONS = ("auto", "host", "device")
_PARTS = ("loss", "gradient norm", "reference gradient norm")


@dataclass
class NonFiniteConfig:
    """What a step with a non-finite loss or gradient does (trainer/nonfinite.py).

    ``skip`` (default): the step is not applied and is counted; the run stops when
    ``max_consecutive`` steps in a row are non-finite (an isolated bad batch costs one step, a
    diverged run stops within a few). ``stop``: the run stops at the first one. ``off``: no
    check and no per-step host sync; a NaN reaches the weights and the run stops at the next
    log step (the behaviour before this option)."""

    policy: str = "skip"  # skip | stop | off
    max_consecutive: int = 5  # skip: stop at this many non-finite steps in a row
    decision: str = "auto"  # auto | host | device: where the skip is decided (module docstring)
    # A run stopped for divergence is refused when started again (it would stop the same way);
    # true continues it anyway, its count of non-finite steps in a row started afresh.
    resume_diverged: bool = False

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(
                f"unknown nonfinite.policy {self.policy!r}; valid policies: {list(POLICIES)}"
            )
        if self.decision not in DECISIONS:
            raise ValueError(
                f"unknown nonfinite.decision {self.decision!r}; valid values: {list(DECISIONS)}"
            )
        if isinstance(self.max_consecutive, bool) or self.max_consecutive < 1:
            raise ValueError(
                f"nonfinite.max_consecutive must be an integer >= 1 (the run stops at that many "
                f"non-finite steps in a row; 1 stops at the first), got {self.max_consecutive!r}"
            )


def nonfinite_flags(
    loss: torch.Tensor, grad_norm: torch.Tensor, ref_norm: torch.Tensor | None = None
) -> torch.Tensor:
    """``[loss, grad norm, reference grad norm]`` as 1.0 where non-finite, on the device."""
    ref = ref_norm if ref_norm is not None else torch.zeros((), device=grad_norm.device)
    parts = torch.stack([loss.detach().float(), grad_norm.detach().float(), ref.detach().float()])
    return (~torch.isfinite(parts)).float()


def device_skip_reason(optimizer: Any) -> str | None:
    """Why ``optimizer`` cannot skip a step on a device flag (``found_inf``), or None if it can."""
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        if all(g.get("fused") for g in optimizer.param_groups):
            return None  # torch's fused kernels skip on found_inf and take their steps back
        return ("torch's AdamW honours found_inf only with its fused kernel "
                "(optimizer.implementation=torch-fused)")  # fmt: skip
    reason = getattr(optimizer, "device_skip_reason", None)
    if reason is None:
        return f"{type(optimizer).__name__} has no device-side skip (found_inf)"
    return reason()


class Diverged(SystemExit):
    """The run stops: too many non-finite steps in a row. train.py records it (checkpoint and
    summary.json) before the process exits with its one line."""

    def __init__(self, message: str, step: int) -> None:
        super().__init__(message)
        self.message, self.step = message, step


FAR_ABOVE = 1.0  # nats above the larger of the first validation loss and log(vocabulary)


def final_state_problem(state: Any, first_val_loss: float | None, vocab_size: int) -> str | None:
    """Why a run that reached its budget is not finished (None: it is): its last steps were
    non-finite (skipped, fewer than the stopping count, when the budget ran out), or its final
    validation loss is not finite, or is far above where it started (more than ``FAR_ABOVE``
    nats above both the first validation loss and a uniform guess's, log(vocabulary)). Such a
    run ends as diverged, never as finished."""
    import math

    if state.nonfinite_in_a_row > 0:
        return (f"its last {state.nonfinite_in_a_row} step(s) to step {state.step} were "
                "non-finite (skipped) when its budget ran out: its final weights are those of a "
                "diverging run; change what diverged (a lower optimizer.lr, say) in a new run")  # fmt: skip
    last = state.last_val_loss
    if last is None:
        return None
    if not math.isfinite(last):
        return (f"its final validation loss is {last} at step {state.step}: not finite; change "
                "what diverged (a lower optimizer.lr, say) in a new run")  # fmt: skip
    ceiling = max(first_val_loss if first_val_loss is not None else 0.0, math.log(vocab_size))
    if last > ceiling + FAR_ABOVE:
        return (f"its final validation loss {last:.4g} at step {state.step} is far above where "
                f"it started ({first_val_loss if first_val_loss is not None else float('nan'):.4g}"
                f"; a uniform guess is {math.log(vocab_size):.4g}): it diverged; change what "
                "diverged (a lower optimizer.lr, say) in a new run")  # fmt: skip
    return None


@dataclass
class _Pending:
    """A step whose flags are not yet read: its number, its tokens, the flags (a host copy)."""

    step: int
    tokens: int
    flags: torch.Tensor
    ready: Any = None  # a CUDA event recorded after the copy, or None (the copy is done)


class NonFiniteGuard:
    """The per-step decision (module docstring). ``state`` is the run's RunState (its ``step``,
    ``tokens`` and ``skipped_steps``); ``out_dir`` the run directory, to name its checkpoint;
    ``batch_tokens`` the tokens of one step (a skipped step's record counts them, as consumed)."""

    def __init__(
        self, cfg: NonFiniteConfig, dist: DistInfo, state: Any, out_dir: Path, batch_tokens: int,
        optimizer: Any = None,
    ) -> None:  # fmt: skip
        self.cfg, self.dist, self.state, self.out_dir = cfg, dist, state, Path(out_dir)
        self.batch_tokens = batch_tokens
        self.skipped = False  # whether the last step read was skipped
        self.pending: _Pending | None = None  # device decision: the step not yet read
        # Called before the stop message names the newest checkpoint: the Trainer waits there
        # for an asynchronous save still in flight, which would otherwise go unnamed.
        self.settle_checkpoints: Callable[[], None] = lambda: None
        self.bind(optimizer)

    def bind(self, optimizer: Any) -> None:
        """Check ``optimizer``'s steps (again when it is rebuilt, as FSDP's sharding does)."""
        self.optimizer = optimizer
        self.on_device = self.enabled and self._choose_device()

    def _choose_device(self) -> bool:
        """The ``decision`` setting against what the optimizer and the device can do (logged)."""
        if self.cfg.decision == "host" or self.optimizer is None:
            return False
        reason = device_skip_reason(self.optimizer)
        if self.cfg.decision == "device" and reason:
            raise ValueError(f"nonfinite.decision=device: {reason}; use nonfinite.decision=auto "
                             "(the host decides then) or host")  # fmt: skip
        cost = getattr(self.optimizer, "device_skip_cost", lambda: None)()
        if self.cfg.decision == "device" and cost:
            log.info("non-finite check on the device at a cost: %s (optim/masked.py)", cost)
        if self.cfg.decision == "auto" and not reason and cost:
            reason = f"{cost}; nonfinite.decision=device takes that cost instead"
        if self.cfg.decision == "auto" and not reason and self.dist.device.type != "cuda":
            reason = f"on {self.dist.device.type} a host read costs nothing to hide"
        log.info("non-finite check: decided %s", "on the device, read one step late" if not
                 reason else f"on the host every step ({reason})")  # fmt: skip
        return not reason

    @property
    def consecutive(self) -> int:
        """Non-finite steps in a row, up to the last one read: kept in the run's state, so it is
        saved with every checkpoint and a resumed run goes on counting (a diverged run does not
        get another ``max_consecutive`` steps each time it is started again)."""
        return self.state.nonfinite_in_a_row

    @consecutive.setter
    def consecutive(self, value: int) -> None:
        self.state.nonfinite_in_a_row = value

    @property
    def enabled(self) -> bool:
        return self.cfg.policy != "off"

    def allows_step(
        self,
        loss: torch.Tensor,
        grad_norm: torch.Tensor,
        ref_norm: torch.Tensor | None = None,
        logger: Any = None,
    ) -> bool:
        """Whether to apply the step being taken (``state.step + 1``): one all-reduce of three
        numbers and one host sync; counts and reports a skipped step, or stops the run."""
        if not self.enabled:
            self.skipped = False
            return True
        flags = all_reduce_sum(nonfinite_flags(loss, grad_norm, ref_norm))
        step, tokens = self.state.step + 1, self.state.tokens + self.batch_tokens
        if not self.on_device:
            return not self._judge(step, tokens, flags.tolist(), logger)
        self.resolve(logger)  # the previous step's flags, read late: no wait on queued work
        self.optimizer.found_inf = flags.sum().clamp_max(1.0)  # 0-d, as torch's grad scaler
        if flags.is_cuda:  # pinned + an event: the read waits for this copy, not later work
            host = torch.empty(flags.shape, dtype=flags.dtype, pin_memory=True)
            host.copy_(flags, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
            self.pending = _Pending(step, tokens, host, ready)
        else:
            self.pending = _Pending(step, tokens, flags)
        return True

    def resolve(self, logger: Any = None) -> None:
        """Read the pending step's flags (device decision) and count, report or stop on them;
        the log steps and checkpoints call it at once, the next step otherwise."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        if pending.ready is not None:
            pending.ready.synchronize()
        if self._judge(pending.step, pending.tokens, pending.flags.tolist(), logger):
            uncount = getattr(self.optimizer, "uncount_last_step", None)
            if uncount is not None:  # the core's host step counters (torch's take their own)
                uncount()

    def _judge(self, step: int, tokens: int, counts: list[float], logger: Any) -> bool:
        """Count, report or stop on one step's summed flags; whether it is skipped."""
        self.skipped = False
        if not any(counts):
            self.consecutive = 0
            return False
        self.consecutive += 1
        limit = 1 if self.cfg.policy == "stop" else self.cfg.max_consecutive
        what = self._describe(counts)
        if self.consecutive >= limit:
            raise Diverged(self._stop_message(what, step), step)
        self.skipped = True
        self.state.skipped_steps += 1
        self._report(what, logger, step, tokens)
        return True

    def metrics(self) -> dict[str, int]:
        """Keys for the per-log-step record: the run's skipped steps (none when ``off``)."""
        return {"skipped_steps": self.state.skipped_steps} if self.enabled else {}

    def _describe(self, counts: list[float]) -> str:
        n = self.dist.world_size
        parts = [
            f"{name} on {int(count)} of {n} ranks" if n > 1 else name
            for name, count in zip(_PARTS, counts)
            if count
        ]
        return "non-finite " + ", ".join(parts)

    def _report(self, what: str, logger: Any, step: int, tokens: int) -> None:
        log.warning("step %d: %s: step skipped (%d in a row, %d in total; the run stops at %d "
                    "in a row, nonfinite.max_consecutive)", step, what, self.consecutive,
                    self.state.skipped_steps, self.cfg.max_consecutive)  # fmt: skip
        if logger is not None:
            logger.log({"step": step, "tokens": tokens, "skipped": 1,
                        "skipped_steps": self.state.skipped_steps})  # fmt: skip

    def _stop_message(self, what: str, step: int) -> str:
        self.settle_checkpoints()
        ckpt = latest_checkpoint(self.out_dir)
        where = f"last checkpoint: {ckpt}" if ckpt else f"no checkpoint in {self.out_dir} yet"
        rule = (
            "nonfinite.policy=stop"
            if self.cfg.policy == "stop"
            else f"{self.consecutive} steps in a row, nonfinite.max_consecutive="
            f"{self.cfg.max_consecutive}"
        )
        return (  # printed by SystemExit on every rank: no log line besides
            f"stopping at step {step}: {what} ({rule}). The weights and optimizer state are "
            f"those of step {step - self.consecutive} (never touched by a non-finite value); "
            f"{where}. Continue from it as a new run: the same command with a lower "
            f"optimizer.lr or another seed{f' and resume={ckpt}' if ckpt else ''}; or look at "
            f"the data of step {step}"
        )
