"""A LLaMA-style model as in the EPFL optimizer benchmark (epfml/llm-optimizer-benchmark,
``src/models/llama.py``): pre-norm blocks with RMSNorm, rotary position embeddings, a SwiGLU MLP,
no biases, the GPT-2 tokenizer and vocabulary (50304), and GPT-2's initialisation (normal std
0.02, residual projections ``c_proj`` std 0.02 / sqrt(2 n_layer)). docs/models.md gives the
source of each choice and the presets' shapes.

Differences from that code, all without effect on what the model can compute or on its training:

- Rotary embeddings rotate the two halves of each head (``rotate_half``, as Hugging Face's
  ``LlamaForCausalLM``) where the benchmark rotates interleaved pairs; the two are the same
  function up to a fixed permutation of each head's query and key rows, which neither the
  initialisation (i.i.d.) nor any optimizer here (element-wise or orthogonally equivariant) can
  tell apart, and the export to Hugging Face is then exact without permuting weights.
- The input and output embeddings are untied by default (``model.tie_embeddings``); the
  benchmark ties them unless ``--untied_embeds``.

The head, the block loop, compilation, counting and sampling are ``CausalLM``'s (model/base.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.base import CausalLM
from model.config import ModelConfig

INIT_STD = 0.02


class RMSNorm(nn.Module):
    """``weight * x / sqrt(mean(x^2) + eps)``, the normalisation in fp32 (as LLaMA and HF)."""

    def __init__(self, ndim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(ndim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotary_tables(
    seq_len: int, head_dim: int, theta: float, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, shape (seq_len, head_dim), fp32: position ``t`` and
    frequency ``theta^(-2i/head_dim)``, each frequency written twice (once per half)."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    inv_freq = 1.0 / (theta**exponent)
    angles = torch.arange(seq_len, device=device).float()[:, None] * inv_freq[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (B, H, T, head_dim): pairs (i, i + head_dim/2) turn by their angle."""
    half = x.size(-1) // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.head_dim = cfg.head_dim
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False)  # q, k, v stacked
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, self.head_dim).transpose(1, 2) for t in (q, k, v))
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class SwiGLU(nn.Module):
    """``c_proj(silu(w1 x) * w2 x)``: w1 is LLaMA's gate, w2 its up projection."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        hidden = cfg.ffn_hidden
        self.w1 = nn.Linear(cfg.n_embd, hidden, bias=False)
        self.w2 = nn.Linear(cfg.n_embd, hidden, bias=False)
        self.c_proj = nn.Linear(hidden, cfg.n_embd, bias=False)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.silu(self.w1(x)) * self.w2(x)))


class LlamaBlock(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ln_2 = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cos, sin)
        return x + self.mlp(self.ln_2(x))


class Llama(CausalLM):
    """LLaMA-style language model with ``GPT``'s interface (model/base.py)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.arch != "llama":
            raise ValueError(f"Llama needs model.arch=llama, got {cfg.arch!r}; use build_model")
        self.config = cfg
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
                drop=nn.Dropout(cfg.dropout),
                h=nn.ModuleList([LlamaBlock(cfg) for _ in range(cfg.n_layer)]),
                ln_f=RMSNorm(cfg.n_embd, cfg.norm_eps),
            )
        )
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.tie_head()
        self.apply(self._init_weights)
        # GPT-2's scaled init of the residual projections (attn.c_proj, mlp.c_proj), as the
        # benchmark's Llama: std 0.02 / sqrt(2 * n_layer).
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=INIT_STD / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """Token embeddings (and dropout) of ``idx``, shape (B, T, n_embd): no position table,
        positions enter through the rotary embeddings in each block."""
        return self.transformer.drop(self.transformer.wte(idx))

    def block_inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The rotary cos and sin tables for ``x``'s length, made at each forward: no buffer, so
        a model built on the meta device and materialised later needs no re-initialisation."""
        cfg = self.config
        return rotary_tables(x.size(1), cfg.head_dim, cfg.rope_theta, x.device)

    def lookup_only_params(self) -> int:
        """An untied token embedding is only looked up; tied, it is also the head."""
        return 0 if self.config.tie_embeddings else self.transformer.wte.weight.numel()
