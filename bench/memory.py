"""Optimizer state per parameter, and ESTIMATED peak training memory per model and optimizer.

    python -m bench.memory                        # GPT-2 small..XL, every optimizer
    python -m bench.memory --models tiny gpt2-small --micro-batch 1 --seq-len 256

State bytes per parameter are measured, not estimated: each optimizer takes one step on the model
built on the meta device (shapes only, no memory), and its state tensors are summed (each tensor
once). tests/test_memory.py checks this equals the state of a real step.

The peak training memory beside it is an ESTIMATE for one GPU with bf16 autocast and flash
attention, at the papers' micro-batch (configs/shared/*.yaml) and 1024 tokens:

    fp32 weights 4N + fp32 grads 4N + optimizer state
    + activations: 34 x n_embd x n_layer bytes per token (Korthikanti et al. 2022, table 2,
      without the attention-score term that flash attention removes); with activation
      checkpointing 4 x n_embd x n_layer (the fp32 block inputs) + one block's 34 x n_embd
    + the loss: plain, 10 bytes per token per vocabulary entry (bf16 logits, their fp32 copy,
      the fp32 log-softmax gradient); chunked (loss_chunk_tokens), 10 bytes per vocabulary entry
      for one chunk of tokens, plus the fp32 gradients of the head (vocab x n_embd x 4) and of the
      hidden states (tokens x n_embd x 4)

It leaves out the CUDA context and allocator fragmentation (a few GiB in nvidia-smi), and
torch.compile's fusions (which lower the activations). bench/train.py measures the real
peak (torch.cuda.max_memory_allocated) on a GPU.
"""

from __future__ import annotations

import argparse

import torch

import optim
from bench.optim import state_bytes
from bench.train import GPU_MODELS, model_config, optimizer_variants, paper_micro_batch
from model import GPT, GPTConfig
from trainer.config import TrainConfig

GIB = 2**30


def state_bytes_after_step(model: torch.nn.Module, opt_cfg) -> int:
    """Bytes of optimizer state after one step with gradients of the parameters' shapes."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt = optim.build_optimizer(model, opt_cfg)
    if getattr(opt, "needs_reference_grad", False):
        opt.store_reference_grad()
    opt.step()
    return state_bytes(opt)


def meta_state_bytes(cfg: GPTConfig, opt_cfg) -> tuple[int, int]:
    """(state bytes, parameter count) of one step on ``cfg``'s model built on the meta device."""
    with torch.device("meta"):
        model = GPT(cfg)
    return state_bytes_after_step(model, opt_cfg), model.num_params()


def estimate_peak_bytes(
    cfg: GPTConfig, *, params: int, state: int, tokens: int, chunk: int, checkpointing: bool
) -> int:
    """The module docstring's estimate of peak training memory (bytes) of one micro-batch."""
    C, L, V = cfg.n_embd, cfg.n_layer, cfg.vocab_size
    acts = (4 * C * L + 34 * C) * tokens if checkpointing else 34 * C * L * tokens
    if chunk > 0:
        loss = 10 * V * min(chunk, tokens) + 4 * V * C + 4 * tokens * C
    else:
        loss = 10 * V * tokens
    return 8 * params + state + acts + loss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(GPU_MODELS))
    ap.add_argument("--optimizers", nargs="+", default=None, help="default: all registered")
    ap.add_argument("--micro-batch", type=int, default=None, help="default: the papers'")
    ap.add_argument("--seq-len", type=int, default=None, help="default: block_size")
    ap.add_argument("--loss-chunk-tokens", type=int, default=TrainConfig.loss_chunk_tokens)
    ap.add_argument("--activation-checkpointing", action="store_true")
    args = ap.parse_args()
    opts = optimizer_variants(args.optimizers or optim.available(), exact=True)
    print(f"loss_chunk_tokens {args.loss_chunk_tokens} (and 0: plain), activation checkpointing "
          f"{args.activation_checkpointing}; peak memory: ESTIMATES (bf16, flash attention)")  # fmt: skip
    print(f"{'model':<12}{'micro-batch':>12} {'optimizer':<22}{'state B/param':>14}"
          f"{'state GiB':>10}{'peak est. GiB':>15}{'plain loss':>11}")  # fmt: skip
    for name in args.models:
        cfg = model_config(name)
        mb = args.micro_batch or paper_micro_batch(name)
        tokens = mb * (args.seq_len or cfg.block_size)
        for label, opt_cfg in opts:
            state, n = meta_state_bytes(cfg, opt_cfg)
            est = dict(
                params=n, state=state, tokens=tokens, checkpointing=args.activation_checkpointing
            )
            chunked = estimate_peak_bytes(cfg, chunk=args.loss_chunk_tokens, **est)
            plain = estimate_peak_bytes(cfg, chunk=0, **est)
            print(f"{name:<12}{mb:>12} {label:<22}{state / n:>14.2f}{state / GIB:>10.2f}"
                  f"{chunked / GIB:>15.1f}{plain / GIB:>11.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
