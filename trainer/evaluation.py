"""Validation loss over a fixed number of tokens spread across ranks (shared by train and eval)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from runtime.device import autocast
from runtime.distributed import all_reduce_sum


@torch.no_grad()
def validation_loss(
    model: torch.nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    device: torch.device,
    dtype: torch.dtype,
) -> float:
    """Mean cross-entropy per token over every rank's batches (each rank passes its own share).

    Sums of per-token losses and token counts are reduced across ranks, so the result does not
    depend on how the windows are split between processes. Padding rows (``data.val_batches``:
    every target -1) count for nothing; a batch of padding alone adds zero (its mean is 0/0).
    """
    was_training = model.training
    model.eval()
    totals = torch.zeros(2, dtype=torch.float64, device=device)
    for x, y in batches:
        with autocast(device, dtype):
            _, loss = model(x, y)
        n = (y != -1).sum()
        # where, not an if: no host sync, and a padding-only batch's nan mean stays out
        totals[0] += torch.where(n > 0, loss.double() * n, 0.0)
        totals[1] += n
    all_reduce_sum(totals)
    model.train(was_training)
    if totals[1].item() == 0:
        raise ValueError("the validation set is empty: no windows of seq_len + 1 tokens")
    return (totals[0] / totals[1]).item()
