"""The GPT-2 model, its config, and parameter/FLOP counting."""

from model.gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig"]
