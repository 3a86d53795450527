"""Hugging Face ``LlamaForCausalLM`` export and import of the LLaMA-style model (model/llama.py).

``model/hf.py`` writes the directory (config.json, model.safetensors, the GPT-2 tokenizer files)
and dispatches here on ``arch`` / ``model_type``. How the two layouts meet:

- Our attention stacks q, k and v in one ``c_attn`` (out = 3 n_embd rows); HF has ``q_proj``,
  ``k_proj``, ``v_proj``: the rows are split on export and stacked on import.
- Rotary embeddings: ours rotate the two halves of each head (HF's ``rotate_half``), so q and k
  need no permutation (the interleaved-pair convention of Meta's checkpoints would need the
  permutation of HF's conversion script).
- SwiGLU ``w1`` / ``w2`` / ``c_proj`` are HF's ``gate_proj`` / ``up_proj`` / ``down_proj``;
  ``ln_1`` / ``ln_2`` / ``ln_f`` are ``input_layernorm`` / ``post_attention_layernorm`` /
  ``model.norm``; ``wte`` is ``model.embed_tokens``; a tied head is written once
  (``tie_word_embeddings``).
- The vocabulary is cut to GPT-2's 50,257 real tokens by default, as the GPT-2 export.
"""

from __future__ import annotations

import torch

from data.tokenizer import EOT
from model.config import ModelConfig
from model.llama import Llama

# ours (after ``transformer.h.{i}.``) -> HF (after ``model.layers.{i}.``), the non-attention ones
_LAYER = {
    "attn.c_proj.weight": "self_attn.o_proj.weight",
    "mlp.w1.weight": "mlp.gate_proj.weight",
    "mlp.w2.weight": "mlp.up_proj.weight",
    "mlp.c_proj.weight": "mlp.down_proj.weight",
    "ln_1.weight": "input_layernorm.weight",
    "ln_2.weight": "post_attention_layernorm.weight",
}
_QKV = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")


def hf_config(cfg: ModelConfig, vocab_size: int, dtype: str = "float32") -> dict:
    """The ``config.json`` of a LlamaForCausalLM with the shape of ``cfg``."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.ffn_hidden,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.n_head,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.block_size,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,  # transformers 4.x reads this one
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},  # and 5.x
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "tie_word_embeddings": bool(cfg.tie_embeddings),
        "initializer_range": 0.02,
        "bos_token_id": EOT,
        "eos_token_id": EOT,
        "use_cache": True,
        "torch_dtype": dtype,
        "dtype": dtype,
    }


def to_hf_state_dict(model: Llama, vocab_size: int | None = None) -> dict[str, torch.Tensor]:
    """Our weights as HF LLaMA tensors (fp32); ``vocab_size`` rows of the embeddings kept."""
    cfg = model.config
    vocab_size = vocab_size or cfg.vocab_size
    if not 0 < vocab_size <= cfg.vocab_size:
        raise ValueError(f"vocab_size={vocab_size} must lie in [1, {cfg.vocab_size}]")
    state = {k: t.detach().float() for k, t in model.state_dict().items()}
    out = {
        "model.embed_tokens.weight": state["transformer.wte.weight"][:vocab_size],
        "model.norm.weight": state["transformer.ln_f.weight"],
    }
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = state["lm_head.weight"][:vocab_size]
    for i in range(cfg.n_layer):
        ours, theirs = f"transformer.h.{i}.", f"model.layers.{i}."
        for name, hf_name in _LAYER.items():
            out[theirs + hf_name] = state[ours + name]
        for hf_name, rows in zip(_QKV, state[ours + "attn.c_attn.weight"].split(cfg.n_embd)):
            out[theirs + hf_name] = rows
    return {k: v.contiguous() for k, v in out.items()}


def config_from_hf(hf: dict, name: str) -> ModelConfig:
    """Our ModelConfig for a HF LLaMA ``config.json``; ValueError where our model cannot match."""
    heads, width = hf["num_attention_heads"], hf["hidden_size"]
    rope = hf.get("rope_parameters") or {}
    theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    scaling = hf.get("rope_scaling") or {}
    checks = {
        "hidden_act": hf.get("hidden_act", "silu") == "silu",
        "num_key_value_heads": hf.get("num_key_value_heads", heads) == heads,
        "head_dim": hf.get("head_dim") in (None, width // heads),
        "attention_bias": not hf.get("attention_bias", False),
        "mlp_bias": not hf.get("mlp_bias", False),
        "rope_type": rope.get("rope_type", scaling.get("rope_type", "default")) == "default",
    }
    bad = [f"{k}={hf.get(k)!r}" for k, ok in checks.items() if not ok]
    if bad:
        raise ValueError(
            f"this LLaMA config cannot be loaded into our Llama ({', '.join(bad)}); supported: "
            "SiLU, no grouped-query attention, head_dim = hidden/heads, no biases, plain RoPE"
        )
    return ModelConfig(
        name=name,
        arch="llama",
        block_size=hf["max_position_embeddings"],
        vocab_size=hf["vocab_size"],
        n_layer=hf["num_hidden_layers"],
        n_head=heads,
        n_embd=width,
        mlp_hidden=hf["intermediate_size"],
        rope_theta=float(theta),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
    )


def from_hf_state_dict(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict:
    """HF LLaMA tensors as our state dict (fp32)."""
    state = {k: t.float() for k, t in state.items()}
    out = {
        "transformer.wte.weight": state["model.embed_tokens.weight"],
        "transformer.ln_f.weight": state["model.norm.weight"],
        "lm_head.weight": state.get("lm_head.weight", state["model.embed_tokens.weight"]),
    }
    for i in range(cfg.n_layer):
        ours, theirs = f"transformer.h.{i}.", f"model.layers.{i}."
        for name, hf_name in _LAYER.items():
            out[ours + name] = state[theirs + hf_name]
        out[ours + "attn.c_attn.weight"] = torch.cat([state[theirs + n] for n in _QKV])
    return {k: v.contiguous() for k, v in out.items()}


def model_from_hf(hf: dict, state: dict[str, torch.Tensor], source: str) -> Llama:
    """Our Llama with the config ``hf`` and the HF tensors ``state``."""
    cfg = config_from_hf(hf, name=hf.get("_name_or_path") or "hf-llama")
    model = Llama(cfg)
    try:
        ours = from_hf_state_dict(state, cfg)
    except KeyError as exc:
        raise ValueError(f"{source}: weights do not fit (missing {exc})") from None
    missing, unexpected = model.load_state_dict(ours, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{source}: weights do not fit (missing {missing}, unexpected {unexpected})"
        )
    return model
