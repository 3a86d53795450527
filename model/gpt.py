"""GPT-2 as in nanoGPT: pre-LN blocks, tied embeddings, tanh-GELU, optional biases and dropout.

Attention goes through ``F.scaled_dot_product_attention`` (flash / memory-efficient kernels on
GPU). The MARS papers' runs set ``scale_attn_by_inverse_layer_idx``: attention scores of layer
``l`` (0-based) are additionally divided by ``l + 1``, i.e. ``scale = 1 / (sqrt(head_dim) * (l+1))``,
which is passed to SDPA as ``scale=``.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.base import CausalLM, tied_state_dict
from model.config import ModelConfig

__all__ = ["GPT", "GPTConfig", "tied_state_dict"]  # tied_state_dict: trainer/checkpoint.py's

GPTConfig = ModelConfig  # the old name; arch defaults to gpt2


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (torch's cannot drop only the bias before 2.1)."""

    def __init__(self, ndim: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.weight, self.bias
        if weight.dtype != x.dtype and torch.promote_types(weight.dtype, x.dtype) == x.dtype:
            # FSDP gathers a block's gains in bf16 while the residual stream is fp32; the CPU
            # kernel takes one dtype (CUDA autocast upcasts them itself). The upcast is exact.
            weight = weight.to(x.dtype)
            bias = None if bias is None else bias.to(x.dtype)
        return F.layer_norm(x, weight.shape, weight, bias, 1e-5)


def _attend(attn: CausalSelfAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
            ) -> torch.Tensor:  # fmt: skip
    """Causal attention of (B, n_head, T, head_dim) tensors with ``attn``'s scale and dropout."""
    dropout_p = attn.dropout if attn.training else 0.0
    return F.scaled_dot_product_attention(
        q, k, v, dropout_p=dropout_p, is_causal=True, scale=attn.scale
    )


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig, layer_idx: int) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.head_dim = cfg.n_embd // cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.dropout = cfg.dropout
        self.scale = 1.0 / math.sqrt(self.head_dim)
        # The papers' 1/(layer+1) on the scores (scale_attn_by_inverse_layer_idx) is applied to q
        # as a 0-d buffer: SDPA's ``scale`` is a float that Dynamo compiles in as a constant (a
        # graph per layer), a buffer is a graph input, so every block shares one compiled graph
        # with attention inside it. Non-persistent: checkpoints and exports are unchanged.
        self.layer_scaled = cfg.scale_attn_by_inverse_layer_idx
        if self.layer_scaled:
            self.register_buffer("layer_scale", torch.tensor(1.0 / (layer_idx + 1)),
                                 persistent=False)  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, self.head_dim).transpose(1, 2) for t in (q, k, v))
        if self.layer_scaled:
            q = q * self.layer_scale  # stays q's dtype: a 0-d tensor does not promote
        y = _attend(self, q, k, v)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, layer_idx: int) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg, layer_idx)
        self.ln_2 = LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(CausalLM):
    """GPT-2 language model. ``forward(idx, targets)`` returns ``(logits, loss)``; the head, the
    block loop, compilation, counting and sampling are ``CausalLM``'s (model/base.py)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        if cfg.arch != "gpt2":
            raise ValueError(f"GPT needs model.arch=gpt2, got {cfg.arch!r}; use build_model")
        self.config = cfg
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
                wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
                drop=nn.Dropout(cfg.dropout),
                h=nn.ModuleList([Block(cfg, i) for i in range(cfg.n_layer)]),
                ln_f=LayerNorm(cfg.n_embd, bias=cfg.bias),
            )
        )
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.tie_head()  # weight tying; checkpoints store the tied weight once
        std = cfg.init_std
        self.apply(lambda m: self._init_weights(m, std))
        # GPT-2's scaled init of the residual projections: std 0.02 / sqrt(2 * n_layer).
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=std / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module, std: float = 0.02) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """Token plus position embeddings (and dropout) of ``idx``, shape (B, T, n_embd)."""
        _, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        return self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))

    def lookup_only_params(self) -> int:
        """The position embedding (the token embedding, tied to the head, multiplies)."""
        return self.transformer.wpe.weight.numel()
