"""The language models (GPT-2 and LLaMA-style), their config, parameter/FLOP counting and
``build_model``, the one way to build a model from its config."""

from model.base import CausalLM
from model.config import ARCHS, ModelConfig
from model.config import ModelConfig as GPTConfig  # the old name: TrainConfig.model's type
from model.gpt import GPT
from model.llama import Llama


def build_model(cfg: ModelConfig) -> CausalLM:
    """The model ``cfg.arch`` names, freshly initialised: ``GPT`` (gpt2) or ``Llama`` (llama)."""
    if cfg.arch == "gpt2":
        return GPT(cfg)
    if cfg.arch == "llama":
        return Llama(cfg)
    raise ValueError(f"unknown model.arch {cfg.arch!r}; valid: {', '.join(ARCHS)}")


__all__ = ["ARCHS", "GPT", "CausalLM", "GPTConfig", "Llama", "ModelConfig", "build_model"]
