"""The typed model config shared by every architecture (GPT-2 and LLaMA-style).

One dataclass for both so ``model=<preset>`` composes through Hydra onto ``TrainConfig.model``;
``arch`` picks the architecture and the fields that belong to the other one must stay at their
defaults (a clear ValueError otherwise). The presets live in configs/model/*.yaml; shapes and
sources in docs/models.md.
"""

from __future__ import annotations

from dataclasses import dataclass

ARCHS = ("gpt2", "llama")
# LLaMA-only fields and their defaults: a GPT-2 config must leave them alone.
LLAMA_DEFAULTS = {"mlp_hidden": None, "rope_theta": 10000.0, "norm_eps": 1e-5}
# GPT-2-only switches: a LLaMA config must leave them off.
GPT2_ONLY = {
    "bias": "LLaMA-style models have no biases",
    "scale_attn_by_inverse_layer_idx": "it is the MARS papers' GPT-2 attention scaling",
}
SWIGLU_MULTIPLE = 256  # the SwiGLU hidden width is rounded up to a multiple of this (LLaMA, EPFL)


def swiglu_hidden(n_embd: int, multiple: int = SWIGLU_MULTIPLE) -> int:
    """LLaMA's SwiGLU width: 2/3 of 4 n_embd, rounded up to ``multiple`` (Touvron et al. 2023;
    ``LlamaMLP`` of epfml/llm-optimizer-benchmark with ``multiple_of=256``)."""
    hidden = int(2 * 4 * n_embd / 3)
    return multiple * ((hidden + multiple - 1) // multiple)


@dataclass
class ModelConfig:
    """Shape of a model. ``arch``: ``gpt2`` (model/gpt.py) or ``llama`` (model/llama.py)."""

    name: str = "custom"
    arch: str = "gpt2"
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64 for speed
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = False  # gpt2 only
    scale_attn_by_inverse_layer_idx: bool = False  # gpt2 only
    # None: the architecture's own (gpt2: tied, the only choice; llama: untied)
    tie_embeddings: bool | None = None
    mlp_hidden: int | None = None  # llama: SwiGLU width; None: swiglu_hidden(n_embd)
    rope_theta: float = 10000.0  # llama: RoPE base
    norm_eps: float = 1e-5  # llama: RMSNorm epsilon
    # gpt2: the weights' init std (GPT-2's 0.02; the residual projections get it / sqrt(2 L)).
    # A width-aware choice keeps GPT-2 small's initial logit scale: 0.02 * sqrt(768 / n_embd)
    # (docs/study.md: the proxies' tied head starts cold at 0.02).
    init_std: float = 0.02

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"unknown model.arch {self.arch!r}; valid: {', '.join(ARCHS)}")
        for key in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, key) < 1:
                raise ValueError(f"model.{key} must be >= 1, got {getattr(self, key)}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"model.n_embd ({self.n_embd}) must be divisible by model.n_head ({self.n_head})"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.dropout must be in [0, 1), got {self.dropout}")
        if not self.init_std > 0:
            raise ValueError(f"model.init_std must be > 0, got {self.init_std}")
        if self.arch != "gpt2" and self.init_std != 0.02:
            raise ValueError("model.init_std is a gpt2 option (model/llama.py keeps its own init)")
        if self.arch == "gpt2":
            self._check_gpt2()
        else:
            self._check_llama()

    def _check_gpt2(self) -> None:
        for key, default in LLAMA_DEFAULTS.items():
            if getattr(self, key) != default:
                raise ValueError(
                    f"model.{key}={getattr(self, key)} applies to model.arch=llama only; "
                    f"remove it or set model.arch=llama"
                )
        if self.tie_embeddings is False:
            raise ValueError(
                "model.tie_embeddings=false: the GPT-2 model always ties its head to the token "
                "embedding; remove it or set model.arch=llama"
            )
        self.tie_embeddings = True

    def _check_llama(self) -> None:
        for key, why in GPT2_ONLY.items():
            if getattr(self, key):
                raise ValueError(
                    f"model.{key}=true applies to model.arch=gpt2 only ({why}); set it to false"
                )
        if (self.n_embd // self.n_head) % 2:
            raise ValueError(
                f"model.n_embd / model.n_head = {self.n_embd // self.n_head} must be even for "
                "rotary embeddings; change model.n_head"
            )
        if self.mlp_hidden is not None and self.mlp_hidden < 1:
            raise ValueError(f"model.mlp_hidden must be >= 1 or null, got {self.mlp_hidden}")
        if self.rope_theta <= 0 or self.norm_eps <= 0:
            raise ValueError(
                f"model.rope_theta ({self.rope_theta}) and model.norm_eps ({self.norm_eps}) "
                "must be > 0"
            )
        if self.tie_embeddings is None:
            self.tie_embeddings = False

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def ffn_hidden(self) -> int:
        """The MLP's hidden width: 4 n_embd (GPT-2) or the SwiGLU width (LLaMA)."""
        if self.arch == "gpt2":
            return 4 * self.n_embd
        return self.mlp_hidden or swiglu_hidden(self.n_embd)
