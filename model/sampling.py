"""Text generation from a trained model: a prompt, temperature and top-k, a seed."""

from __future__ import annotations

import torch

from data.tokenizer import EOT, decode, encode
from runtime.device import autocast


@torch.no_grad()
def sample_text(
    model: torch.nn.Module,
    prompt: str = "",
    *,
    num_samples: int = 1,
    max_new_tokens: int = 100,
    temperature: float = 0.8,
    top_k: int | None = 200,
    seed: int | None = 1337,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> list[str]:
    """``num_samples`` continuations of ``prompt`` (the text after the prompt, decoded).

    An empty prompt starts from ``<|endoftext|>``, a document boundary. ``temperature`` 0 is
    greedy decoding: there is one continuation, computed once and repeated ``num_samples`` times.
    ``top_k`` keeps the k most likely tokens (None: all). Same seed, same text.
    """
    if num_samples < 1 or max_new_tokens < 1:
        raise ValueError(
            f"num_samples ({num_samples}) and max_new_tokens ({max_new_tokens}) must be >= 1"
        )
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0: greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
    device = torch.device(device)
    ids = encode(prompt) if prompt else [EOT]
    rows = 1 if temperature == 0 else num_samples  # greedy: every row would be the same
    x = torch.tensor([ids] * rows, dtype=torch.long, device=device)
    if seed is not None:
        torch.manual_seed(seed)
    model.eval()
    with autocast(device, dtype):
        y = model.generate(x, max_new_tokens, temperature=temperature, top_k=top_k)
    texts = [decode(row[len(ids) :].tolist()) for row in y]
    return texts * num_samples if temperature == 0 else texts
