"""GPT-2 as in nanoGPT: pre-LN blocks, tied embeddings, tanh-GELU, optional biases and dropout.

Attention goes through ``F.scaled_dot_product_attention`` (flash / memory-efficient kernels on
GPU). The MARS papers' runs set ``scale_attn_by_inverse_layer_idx``: attention scores of layer
``l`` (0-based) are additionally divided by ``l + 1``, i.e. ``scale = 1 / (sqrt(head_dim) * (l+1))``,
which is passed to SDPA as ``scale=``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from model.loss import linear_cross_entropy


@dataclass
class GPTConfig:
    """Shape of a GPT-2 model. The presets live in configs/model/*.yaml."""

    name: str = "custom"
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64 for speed
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = False
    scale_attn_by_inverse_layer_idx: bool = False

    def __post_init__(self) -> None:
        for key in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, key) < 1:
                raise ValueError(f"model.{key} must be >= 1, got {getattr(self, key)}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"model.n_embd ({self.n_embd}) must be divisible by model.n_head ({self.n_head})"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.dropout must be in [0, 1), got {self.dropout}")


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (torch's cannot drop only the bias before 2.1)."""

    def __init__(self, ndim: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


def _attend(attn: CausalSelfAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
            ) -> torch.Tensor:  # fmt: skip
    """Causal attention of (B, n_head, T, head_dim) tensors with ``attn``'s scale and dropout."""
    dropout_p = attn.dropout if attn.training else 0.0
    return F.scaled_dot_product_attention(
        q, k, v, dropout_p=dropout_p, is_causal=True, scale=attn.scale
    )


_attend_untraced = torch.compiler.disable(_attend)


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
        if cfg.scale_attn_by_inverse_layer_idx:
            self.scale /= layer_idx + 1
            # The scale differs by layer, and SDPA takes it as a float that Dynamo compiles in as
            # a constant: a graph per layer. Called outside the graph (the same aten call, so the
            # same rounding), the blocks share their compiled graphs before and after it.
        self.attend_outside_graph = cfg.scale_attn_by_inverse_layer_idx

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, self.head_dim).transpose(1, 2) for t in (q, k, v))
        attend = _attend_untraced if self.attend_outside_graph else _attend
        y = attend(self, q, k, v)
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


TIED_ALIAS, TIED_SOURCE = "lm_head.weight", "transformer.wte.weight"


def _fill_tied_head(state: dict, prefix: str, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
    """Load hook: a state dict stored without the tied ``lm_head.weight`` (``tied_state_dict``)
    gets it back from ``transformer.wte.weight``; one that has both keys loads as before."""
    if prefix + TIED_ALIAS not in state and prefix + TIED_SOURCE in state:
        state[prefix + TIED_ALIAS] = state[prefix + TIED_SOURCE]


def tied_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` with each tensor that aliases an earlier one (GPT's tied
    ``lm_head.weight``) left out, so checkpoints store and stage it once; ``GPT.load_state_dict``
    fills it in again."""
    seen: set[tuple[int, int]] = set()
    out = {}
    for key, t in model.state_dict().items():
        where = (t.untyped_storage().data_ptr(), t.storage_offset())
        if where in seen and t.numel() > 0:
            continue
        seen.add(where)
        out[key] = t
    return out


class GPT(nn.Module):
    """GPT-2 language model. ``forward(idx, targets)`` returns ``(logits, loss)``.

    Two execution choices, attributes rather than config because they change neither the model
    nor (beyond rounding) its loss, so a run may change them when it resumes (training sets them
    from ``TrainConfig.loss_chunk_tokens`` and ``TrainConfig.activation_checkpointing``):

    - ``loss_chunk_tokens``: with targets and a value > 0, the loss goes through
      ``model.loss.linear_cross_entropy`` that many tokens at a time and ``logits`` is None
      (the full logits tensor is never made); 0 keeps the plain head + ``F.cross_entropy``.
    - ``activation_checkpointing``: in training with gradients on, each block's activations
      are recomputed in the backward pass instead of kept (``torch.utils.checkpoint``).
    """

    loss_chunk_tokens: int = 0
    activation_checkpointing: bool = False

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
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
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        # Checkpoints store the tied weight once (``tied_state_dict``): fill in the alias.
        self._register_load_state_dict_pre_hook(_fill_tied_head)
        self.apply(self._init_weights)
        # GPT-2's scaled init of the residual projections: std 0.02 / sqrt(2 * n_layer).
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Logits of shape (B, T, vocab) and, with targets, the mean cross-entropy.

        Targets equal to -1 are ignored. With targets and ``loss_chunk_tokens > 0`` the logits
        are not computed and None is returned in their place.
        """
        return self.head(self.hidden_states(idx), targets)

    def head(
        self, h: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``forward`` after the final LayerNorm: the logits and/or the loss of ``h``."""
        if targets is not None and self.loss_chunk_tokens > 0:
            loss = linear_cross_entropy(
                h, self.lm_head.weight, targets, chunk=self.loss_chunk_tokens
            )
            return None, loss
        logits = self.lm_head(h)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(
            logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1
        )
        return logits, loss

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """Token plus position embeddings (and dropout) of ``idx``, shape (B, T, n_embd)."""
        _, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        return self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))

    def compile_regions(self, **kwargs: object) -> None:
        """``torch.compile`` the model region by region, in place: each block (blocks alike share
        one compiled graph: Dynamo caches by code, and the weights are inputs), the
        embeddings, the final LayerNorm and the head with its loss. Everything runs compiled as
        with ``torch.compile(model)``, but Dynamo, AOTAutograd and Inductor work on one block
        instead of ``n_layer`` of them (docs/gpu-readiness.md has the first-step times).

        With ``scale_attn_by_inverse_layer_idx`` (the papers' presets) each layer's attention
        has its own scale, a float that Dynamo would compile in as a constant, a graph per layer:
        the attention call then runs outside the graph (``_attend_untraced``; the same aten
        kernel as inside one), and the blocks share their graphs before and after it."""
        for block in self.transformer.h:
            block.compile(**kwargs)
        self.transformer.ln_f.compile(**kwargs)
        self.embed = torch.compile(self.embed, **kwargs)  # instance attributes: this model only
        self.head = torch.compile(self.head, **kwargs)

    def hidden_states(self, idx: torch.Tensor) -> torch.Tensor:
        """The final LayerNorm's output, shape (B, T, n_embd): ``forward`` without the head.

        Scoring a few positions (``evals/harness.py``) applies ``lm_head`` to those alone.
        """
        _, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(
                f"sequence length {T} exceeds the model's block_size {self.config.block_size}"
            )
        return self.transformer.ln_f(self.blocks(self.embed(idx)))

    def blocks(self, x: torch.Tensor) -> torch.Tensor:
        """The transformer blocks, in order (recomputed in the backward pass with
        ``activation_checkpointing``)."""
        recompute = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        for block in self.transformer.h:
            x = checkpoint(block, x, use_reentrant=False) if recompute else block(x)
        return x

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count (tied weights counted once).

        ``non_embedding=True`` drops the position embedding, as nanoGPT does for FLOP counts: the
        token embedding stays because, tied to the head, it does a real matmul.
        """
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.transformer.wpe.weight.numel()
        return n

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token (forward + backward): 6N + 12 L H Q T (PaLM appendix B)."""
        cfg = self.config
        T = seq_len or cfg.block_size
        head_dim = cfg.n_embd // cfg.n_head
        return (
            6 * self.num_params(non_embedding=True) + 12 * cfg.n_layer * cfg.n_head * head_dim * T
        )

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
    ) -> torch.Tensor:
        """Sample ``max_new_tokens`` tokens after the prompt ``idx`` of shape (B, T)."""
        for _ in range(max_new_tokens):
            ctx = idx[:, -self.config.block_size :]
            logits, _ = self(ctx)
            logits = logits[:, -1, : min(logits.size(-1), 50257)].float()
            if temperature <= 0:
                nxt = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                nxt = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, nxt), dim=1)
        return idx
