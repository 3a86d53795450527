"""What every language model of the project shares: the head and its loss, the block loop,
region compilation, counting and sampling. ``GPT`` (model/gpt.py) and ``Llama``
(model/llama.py) subclass ``CausalLM`` and provide ``embed`` and their blocks.

The interface (other code relies on it): ``config``, ``transformer`` (an ``nn.ModuleDict`` with
``wte`` the token ``nn.Embedding``, ``h`` the ``nn.ModuleList`` of blocks and ``ln_f`` the final
norm), ``lm_head`` (``nn.Linear``), ``loss_chunk_tokens``, ``activation_checkpointing`` and the
methods below.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from model.loss import linear_cross_entropy

TIED_ALIAS, TIED_SOURCE = "lm_head.weight", "transformer.wte.weight"
REAL_VOCAB = 50257  # GPT-2's tokens; rows past it are padding and never sampled


def fill_tied_head(state: dict, prefix: str, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
    """Load hook: a state dict stored without the tied ``lm_head.weight`` (``tied_state_dict``)
    gets it back from ``transformer.wte.weight``; one that has both keys loads as before."""
    if prefix + TIED_ALIAS not in state and prefix + TIED_SOURCE in state:
        state[prefix + TIED_ALIAS] = state[prefix + TIED_SOURCE]


def tied_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` with each tensor that aliases an earlier one (a tied
    ``lm_head.weight``) left out, so checkpoints store and stage it once; the models'
    ``load_state_dict`` fills it in again."""
    seen: set[tuple[int, int]] = set()
    out = {}
    for key, t in model.state_dict().items():
        where = (t.untyped_storage().data_ptr(), t.storage_offset())
        if where in seen and t.numel() > 0:
            continue
        seen.add(where)
        out[key] = t
    return out


class CausalLM(nn.Module):
    """A decoder-only language model. ``forward(idx, targets)`` returns ``(logits, loss)``.

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
    transformer: nn.ModuleDict
    lm_head: nn.Linear

    def tie_head(self) -> None:
        """Share ``lm_head.weight`` with the token embedding; checkpoints store it once."""
        self.transformer.wte.weight = self.lm_head.weight
        self._register_load_state_dict_pre_hook(fill_tied_head)

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
        """``forward`` after the final norm: the logits and/or the loss of ``h``."""
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
        """The blocks' input for the token ids ``idx``, shape (B, T, n_embd)."""
        raise NotImplementedError

    def block_inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Extra inputs every block takes after ``x`` (LLaMA: the rotary tables); none here."""
        return ()

    def compile_regions(self, **kwargs: object) -> None:
        """``torch.compile`` the model region by region, in place: each block (blocks alike share
        one compiled graph: Dynamo caches by code, and the weights are inputs), the
        embeddings, the final norm and the head with its loss. Everything runs compiled as
        with ``torch.compile(model)``, but Dynamo, AOTAutograd and Inductor work on one block
        instead of ``n_layer`` of them (docs/gpu-readiness.md has the first-step times).

        Blocks must not differ by a constant Dynamo compiles in (one by one they would cost a
        compile each): GPT-2's per-layer attention scale is a buffer, a graph input
        (model/gpt.py, ``layer_scale``)."""
        for block in self.transformer.h:
            block.compile(**kwargs)
        self.transformer.ln_f.compile(**kwargs)
        self.embed = torch.compile(self.embed, **kwargs)  # instance attributes: this model only
        self.head = torch.compile(self.head, **kwargs)

    def hidden_states(self, idx: torch.Tensor) -> torch.Tensor:
        """The final norm's output, shape (B, T, n_embd): ``forward`` without the head.

        Scoring a few positions (``evals/scoring.py``) applies ``lm_head`` to those alone.
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
        extra = self.block_inputs(x)
        for block in self.transformer.h:
            if recompute:
                x = checkpoint(block, x, *extra, use_reentrant=False)
            else:
                x = block(x, *extra)
        return x

    def lookup_only_params(self) -> int:
        """Parameters that are only looked up, never multiplied (position embeddings, an untied
        token embedding): left out of ``num_params(non_embedding=True)``."""
        return 0

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count (tied weights counted once).

        ``non_embedding=True`` drops the embeddings that do no matmul, as nanoGPT does for FLOP
        counts: a token embedding tied to the head stays (the head is a real matmul).
        """
        n = sum(p.numel() for p in self.parameters())
        return n - self.lookup_only_params() if non_embedding else n

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token (forward + backward): 6N + 12 L H Q T (PaLM appendix B),
        N the parameters that multiply (``num_params(non_embedding=True)``, the head included)."""
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
            logits = logits[:, -1, : min(logits.size(-1), REAL_VOCAB)].float()
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
