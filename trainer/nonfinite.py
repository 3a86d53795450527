"""Non-finite loss or gradients: detect them once per step, agree on every rank, skip or stop.

Detection. One fused check per step, not one per parameter: the global gradient norm that the
loop already computes for clipping (``clip_grad_norm_``) is finite iff every gradient is (up to
gradients above ~1e19, whose squares overflow: a diverging step, skipped too), plus this rank's
loss, plus (exact MARS) the norm of the reference pass's gradient, which would otherwise become
the next step's ``g_ref``. The three flags of every rank are summed by one all-reduce of three
numbers, so every rank takes the same decision even when only one rank's loss is NaN (DDP
averages gradients, so a NaN gradient of one rank already reaches all; the loss is per rank).

The one host synchronisation. The decision is read on the host (``.tolist()`` of those three
numbers) once per step, and the optimizer step is then simply not called. This is the only way
that keeps *every* optimizer's state untouched (torch's AdamW, the MARS core, and whatever is
registered next, with step counters that may be Python ints): a sync-free masked step would need
each optimizer to mask each of its state updates on a device flag (torch's fused AdamW can, via
``found_inf``; our optimizers and third-party ones cannot), or a copy of the whole optimizer
state per step. The cost: the host waits for the backward pass to finish before it launches the
optimizer step, so the launch time of the optimizer step is no longer hidden behind the
backward; the kernels themselves are unchanged. ``policy=off`` removes the check and the sync.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from runtime.distributed import DistInfo, all_reduce_sum
from trainer.checkpoint import latest_checkpoint

log = logging.getLogger(__name__)

POLICIES = ("skip", "stop", "off")
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

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(
                f"unknown nonfinite.policy {self.policy!r}; valid policies: {list(POLICIES)}"
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


class NonFiniteGuard:
    """The per-step decision (module docstring). ``state`` is the run's RunState (its ``step``,
    ``tokens`` and ``skipped_steps``); ``out_dir`` the run directory, to name its checkpoint;
    ``batch_tokens`` the tokens of one step (a skipped step's record counts them, as consumed)."""

    def __init__(
        self, cfg: NonFiniteConfig, dist: DistInfo, state: Any, out_dir: Path, batch_tokens: int
    ) -> None:
        self.cfg, self.dist, self.state, self.out_dir = cfg, dist, state, Path(out_dir)
        self.batch_tokens = batch_tokens
        self.consecutive = 0  # non-finite steps in a row, up to this one
        self.skipped = False  # whether the last step was skipped

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
        self.skipped = False
        if not self.enabled:
            return True
        counts = all_reduce_sum(nonfinite_flags(loss, grad_norm, ref_norm)).tolist()
        if not any(counts):
            self.consecutive = 0
            return True
        self.consecutive += 1
        limit = 1 if self.cfg.policy == "stop" else self.cfg.max_consecutive
        what = self._describe(counts)
        if self.consecutive >= limit:
            raise SystemExit(self._stop_message(what))
        self.skipped = True
        self.state.skipped_steps += 1
        self._report(what, logger)
        return False

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

    def _report(self, what: str, logger: Any) -> None:
        step = self.state.step + 1
        log.warning("step %d: %s: step skipped (%d in a row, %d in total; the run stops at %d "
                    "in a row, nonfinite.max_consecutive)", step, what, self.consecutive,
                    self.state.skipped_steps, self.cfg.max_consecutive)  # fmt: skip
        if logger is not None:
            logger.log({"step": step, "tokens": self.state.tokens + self.batch_tokens,
                        "skipped": 1, "skipped_steps": self.state.skipped_steps})  # fmt: skip

    def _stop_message(self, what: str) -> str:
        step = self.state.step + 1
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
