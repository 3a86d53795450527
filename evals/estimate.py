"""How long an evaluation will take, said before it starts (eval.py).

A user who runs ``python eval.py checkpoint=runs/NAME`` on a CPU should learn at once that
HellaSwag has 10,042 rows and that scoring them takes hours there, and how to ask for fewer
(``limit=N``). The estimate is the number of tokens each task feeds the model, times the time
per token of this model on this device, measured by two short forward passes (the first warms
up). Tokens are counted from characters (about 4 per GPT-2 token), not by encoding every
request, so the estimate itself costs well under a second.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from evals.tasks import Example
from runtime.device import autocast

CHARS_PER_TOKEN = 4.0  # GPT-2 BPE on English text, roughly
CALIBRATION_ROWS = 8
LONG_S = 600.0  # above this, say how limit= shortens it


@torch.no_grad()
def seconds_per_token(model: torch.nn.Module, device: torch.device, dtype: torch.dtype,
                      length: int, rows: int = CALIBRATION_ROWS) -> float:  # fmt: skip
    """Forward time per token of ``model`` at batches of ``rows`` sequences of ``length`` tokens,
    as the task will run them (a batch of one pays the call's overhead per row), at most
    CALIBRATION_ROWS rows: the second of two passes (the first one warms up)."""
    length = max(1, min(length, model.config.block_size))
    x = torch.zeros((max(1, min(rows, CALIBRATION_ROWS)), length), dtype=torch.long, device=device)
    elapsed = 0.0
    for _ in range(2):
        t0 = time.perf_counter()
        with autocast(device, dtype):
            model(x, x)  # with the loss: its softmax over the vocabulary costs as much
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - t0
    return elapsed / x.numel()


def task_tokens(examples: Sequence[Example], block_size: int) -> tuple[int, int]:
    """(requests, tokens) that scoring ``examples`` runs: one request per choice, each at most
    ``block_size`` tokens long."""
    requests = tokens = 0
    for ex in examples:
        for ctx, cont in zip(ex.contexts, ex.continuations, strict=True):
            requests += 1
            tokens += min(block_size, int((len(ctx) + len(cont)) / CHARS_PER_TOKEN) + 1)
    return requests, tokens


def duration(seconds: float) -> str:
    """``40 s``, ``12 min``, ``1.5 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def plan_lines(rows: dict[str, int], tokens: dict[str, int], per_token: dict[str, float],
               device: str, limit: int | None) -> list[str]:  # fmt: skip
    """One line per task (rows, about how long on ``device`` at ``per_token[task]`` seconds per
    token) and, when the whole takes longer than LONG_S without a limit, one saying what
    ``limit=`` would make of it."""
    lines, total = [], 0.0
    for name, n in rows.items():
        seconds = tokens[name] * per_token[name]
        total += seconds
        what = f"{n:,} rows" if name != "val" else f"{tokens[name]:,} tokens"
        lines.append(f"{name}: {what}, about {duration(seconds)} on {device}")
    lines.append(f"in all about {duration(total)}")
    if limit is None and total > LONG_S:
        scored = {k: v for k, v in rows.items() if k != "val"}
        if scored:
            most = max(scored.values())
            full = sum(tokens[k] * per_token[k] for k in scored)
            for n in (500, 200, 100, 50):
                part = sum(tokens[k] * per_token[k] * min(1.0, n / max(v, 1))
                           for k, v in scored.items())  # fmt: skip
                if part <= LONG_S or n == 50:
                    break
            short = total - full + part
            lines.append(f"limit={n} scores the first {n} of each task's {most:,} rows or fewer: "
                         f"about {duration(short)} in all")  # fmt: skip
    return lines
