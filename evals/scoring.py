"""Log-likelihood scoring of multiple-choice examples, batched and spread over ranks.

The definitions follow lm-evaluation-harness (its ``HFLM`` model class):

- a request is (context, continuation). Trailing whitespace of the context moves to the front
  of the continuation; then ``context + continuation`` is encoded whole and the continuation's
  tokens are those after the context's own encoding (so BPE merges across the boundary are
  honoured). An empty context becomes the ``<|endoftext|>`` token.
- the model sees ``(context + continuation)[-(block_size + 1):][:-1]`` (left truncation) and the
  log-likelihood is the sum of the log-probabilities of the continuation tokens.
- the softmax runs over the first 50,257 logits (GPT-2's real vocabulary): our models pad the
  vocabulary to 50,304 rows that are never targets, and the Hugging Face export keeps 50,257 rows
  (``model/hf.py``), so both give the same numbers.

Requests are sorted by length (longest first) and batched with right padding, which a causal
model cannot see. Examples are dealt to ranks round-robin and counts are summed over ranks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from tqdm import tqdm

from data.tokenizer import EOT, VOCAB_SIZE, encode
from evals.tasks import Example
from runtime.device import autocast
from runtime.distributed import all_reduce_sum

Request = tuple[list[int], list[int]]  # (context tokens, continuation tokens)


def encode_pair(context: str, continuation: str) -> Request:
    """Context and continuation tokens as lm-eval's ``HFLM._encode_pair`` makes them."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    if not context:
        return [EOT], encode(continuation)
    ctx = encode(context)
    whole = encode(context + continuation)
    return ctx, whole[len(ctx) :]


def _window(request: Request, block_size: int) -> tuple[list[int], list[int]]:
    """The model's input (left-truncated) and the continuation tokens it is scored on."""
    ctx, cont = request
    cont = cont[-block_size:]  # a continuation longer than the context window: score its tail
    inp = (ctx + cont)[-(block_size + 1) :][:-1]
    return inp, cont


def _scored_logits(
    model: torch.nn.Module, x: torch.Tensor, spans: list[tuple[int, int]]
) -> torch.Tensor:
    """Logits at the positions ``spans`` (row by row, concatenated): shape (positions, vocab).

    Our GPT applies its head to those positions only (most of a small model's cost is the
    50,304-way head); other models (a Hugging Face one, a test double) run in full.
    """
    if hasattr(model, "hidden_states") and hasattr(model, "lm_head"):
        h = model.hidden_states(x)
        return model.lm_head(torch.cat([h[r, a:b] for r, (a, b) in enumerate(spans)]))
    out = model(x)
    logits = out[0] if isinstance(out, tuple) else out
    return torch.cat([logits[r, a:b] for r, (a, b) in enumerate(spans)])


@torch.no_grad()
def loglikelihoods(
    model: torch.nn.Module,
    requests: Sequence[Request],
    *,
    block_size: int,
    batch_size: int = 32,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    progress: bool = False,
    desc: str = "loglikelihood",
) -> list[float]:
    """Summed log-probability of each request's continuation given its context."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    device = torch.device(device)
    windows = [_window(r, block_size) for r in requests]
    if any(not cont for _, cont in windows):
        raise ValueError("a continuation encodes to no tokens; every choice needs some text")
    order = sorted(range(len(windows)), key=lambda i: -len(windows[i][0]))
    out = [0.0] * len(windows)
    was_training = model.training
    model.eval()
    batches = range(0, len(order), batch_size)
    for start in tqdm(batches, desc=desc, disable=not progress, unit="batch", dynamic_ncols=True):
        ids = order[start : start + batch_size]
        width = max(len(windows[i][0]) for i in ids)
        x = torch.full((len(ids), width), EOT, dtype=torch.long)
        for row, i in enumerate(ids):
            inp = windows[i][0]
            x[row, : len(inp)] = torch.tensor(inp)
        spans = [(len(windows[i][0]) - len(windows[i][1]), len(windows[i][0])) for i in ids]
        with autocast(device, dtype):
            logits = _scored_logits(model, x.to(device), spans)
        logp = F.log_softmax(logits[:, : min(logits.size(-1), VOCAB_SIZE)].float(), dim=-1)
        targets = torch.tensor([t for i in ids for t in windows[i][1]], device=logp.device)
        picked = logp.gather(1, targets.unsqueeze(1)).squeeze(1).double().cpu()
        for i, part in zip(ids, picked.split([len(windows[i][1]) for i in ids])):
            out[i] = part.sum().item()
    model.train(was_training)
    return out


def score_examples(lls: Sequence[Sequence[float]], examples: Sequence[Example]) -> dict[str, float]:
    """Counts of correct answers: ``acc`` (highest sum) and ``acc_norm`` (sum / characters).

    Ties go to the first choice, as with numpy's argmax in lm-eval.
    """
    acc = acc_norm = 0.0
    for ll, ex in zip(lls, examples, strict=True):
        norm = [v / max(len(c), 1) for v, c in zip(ll, ex.choices, strict=True)]
        acc += float(_argmax(ll) == ex.gold)
        acc_norm += float(_argmax(norm) == ex.gold)
    return {"n": float(len(examples)), "acc": acc, "acc_norm": acc_norm}


def _argmax(values: Sequence[float]) -> int:
    return max(range(len(values)), key=lambda i: (values[i], -i))


@torch.no_grad()
def evaluate_examples(
    model: torch.nn.Module,
    examples: Sequence[Example],
    *,
    block_size: int,
    batch_size: int = 32,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    rank: int = 0,
    world_size: int = 1,
    progress: bool = False,
    desc: str = "eval",
) -> dict[str, float]:
    """acc and acc_norm (fractions) with their standard errors over all ranks' examples.

    Rank r scores examples r, r + world_size, ...; the counts are summed across ranks.
    """
    mine = list(examples[rank::world_size])
    requests, cache = [], {}
    for ex in mine:
        for ctx, cont in zip(ex.contexts, ex.continuations, strict=True):
            key = (ctx, cont)
            if key not in cache:
                cache[key] = encode_pair(ctx, cont)
            requests.append(cache[key])
    flat = loglikelihoods(
        model,
        requests,
        block_size=block_size,
        batch_size=batch_size,
        device=device,
        dtype=dtype,
        progress=progress,
        desc=desc,
    )
    per_example, k = [], 0
    for ex in mine:
        per_example.append(flat[k : k + len(ex.choices)])
        k += len(ex.choices)
    counts = score_examples(per_example, mine)
    totals = torch.tensor([counts["n"], counts["acc"], counts["acc_norm"]], dtype=torch.float64)
    totals = all_reduce_sum(totals.to(device)).cpu()
    n = int(totals[0].item())
    if n == 0:
        raise ValueError("no examples to evaluate")
    result: dict[str, float | None] = {"n": n}
    for key, count in (("acc", totals[1].item()), ("acc_norm", totals[2].item())):
        p = count / n
        result[key] = p
        result[f"{key}_stderr"] = math.sqrt(p * (1 - p) / (n - 1)) if n > 1 else None
    return result
