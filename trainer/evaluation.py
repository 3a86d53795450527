"""Validation loss over a fixed token budget spread across ranks (shared by train and eval)."""

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
    depend on how the windows are split between processes.
    """
    was_training = model.training
    model.eval()
    totals = torch.zeros(2, dtype=torch.float64, device=device)
    for x, y in batches:
        with autocast(device, dtype):
            _, loss = model(x, y)
        n = (y != -1).sum()
        totals[0] += loss.double() * n
        totals[1] += n
    all_reduce_sum(totals)
    model.train(was_training)
    if totals[1].item() == 0:
        raise ValueError("the validation set is empty: no windows of seq_len + 1 tokens")
    return (totals[0] / totals[1]).item()
