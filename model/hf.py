"""Hugging Face ``GPT2LMHeadModel`` export and import (LLaMA: model/hf_llama.py).

Export writes a directory that ``transformers`` and ``lm_eval --model hf`` load: ``config.json``,
``model.safetensors`` and the GPT-2 tokenizer files (``model/hf_tokenizer.py``). Differences
between the two layouts, and how they are bridged:

- HF's ``Conv1D`` stores weights as (in, out); ``nn.Linear`` as (out, in): transposed both ways.
- Our ``bias=False`` models have no Linear/LayerNorm biases; HF GPT-2 always has them: zeros are
  written. An imported model whose biases are all zero gets ``bias=False``.
- Our vocabulary is padded to 50,304 rows; by default the export keeps the 50,257 real tokens
  (``vocab_size=50257``, as OpenAI's GPT-2), so the exported logits equal ours on every real token
  id and a softmax over the exported logits equals ours over the first 50,257.
  ``keep_vocab_padding=True`` exports all rows instead.
- ``scale_attn_by_inverse_layer_idx`` (the MARS papers' runs) is a GPT2Config field of the same
  name; attention, MLP (``gelu_new`` = tanh GELU) and LayerNorm (eps 1e-5) are the same maths.

Import (nanoGPT's ``from_pretrained``, from a local directory) reads ``config.json`` and
``model.safetensors`` or ``pytorch_model.bin``, with or without the ``transformer.`` key prefix.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from data.tokenizer import EOT, VOCAB_SIZE
from model.base import CausalLM
from model.gpt import GPT, GPTConfig
from model.hf_tokenizer import write_tokenizer_files
from runtime.files import current_umask

log = logging.getLogger(__name__)

_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def hf_config(cfg: GPTConfig, vocab_size: int, dtype: str = "float32") -> dict:
    """The ``config.json`` of a GPT2LMHeadModel with the shape of ``cfg``."""
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": vocab_size,
        "n_positions": cfg.block_size,
        "n_ctx": cfg.block_size,
        "n_embd": cfg.n_embd,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_inner": None,
        "activation_function": "gelu_new",
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "layer_norm_epsilon": 1e-5,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": cfg.scale_attn_by_inverse_layer_idx,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True,
        "bos_token_id": EOT,
        "eos_token_id": EOT,
        "use_cache": True,
        "torch_dtype": dtype,
        "dtype": dtype,
    }


def to_hf_state_dict(model: GPT, vocab_size: int | None = None) -> dict[str, torch.Tensor]:
    """Our weights as HF GPT-2 tensors (``transformer.*`` keys, no tied ``lm_head``).

    ``vocab_size``: rows of the embedding to keep (default: all of the model's).
    """
    cfg = model.config
    vocab_size = vocab_size or cfg.vocab_size
    if not 0 < vocab_size <= cfg.vocab_size:
        raise ValueError(f"vocab_size={vocab_size} must lie in [1, {cfg.vocab_size}]")
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied to transformer.wte.weight
        t = t.detach().float()
        if name == "transformer.wte.weight":
            t = t[:vocab_size]
        elif name.endswith(_CONV1D):
            t = t.t()
        out[name] = t.contiguous()
    if not cfg.bias:  # HF GPT-2 always has biases: zeros are the same function
        for name, t in list(out.items()):
            if name.endswith("weight") and "wte" not in name and "wpe" not in name:
                rows = t.shape[1] if name.endswith(_CONV1D) else t.shape[0]
                out[name[: -len("weight")] + "bias"] = torch.zeros(rows)
    return out


def save_hf(
    model: CausalLM,
    out_dir: str | Path,
    *,
    keep_vocab_padding: bool = False,
    dtype: str = "float32",
) -> Path:
    """Write ``model`` as a HF directory (config, safetensors, tokenizer): a GPT2LMHeadModel, or a
    LlamaForCausalLM for ``arch=llama`` (model/hf_llama.py)."""
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid: {sorted(_DTYPES)}")
    cfg = model.config
    vocab = cfg.vocab_size if keep_vocab_padding else min(VOCAB_SIZE, cfg.vocab_size)
    if cfg.arch == "llama":
        from model import hf_llama

        tensors, config = (
            hf_llama.to_hf_state_dict(model, vocab),
            hf_llama.hf_config(cfg, vocab, dtype),
        )
    else:
        tensors, config = to_hf_state_dict(model, vocab), hf_config(cfg, vocab, dtype)
    return write_hf_dir(out_dir, tensors, config, dtype=dtype, block_size=cfg.block_size)


def write_hf_dir(
    out_dir: str | Path, tensors: dict, config: dict, *, dtype: str, block_size: int
) -> Path:
    """model.safetensors (in ``dtype``), config.json, generation_config.json and the GPT-2
    tokenizer files in ``out_dir``."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.to(_DTYPES[dtype]).contiguous() for k, v in tensors.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o666 & ~current_umask())  # save_file makes it 0600
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": EOT, "eos_token_id": EOT}, indent=2) + "\n"
    )
    write_tokenizer_files(out, model_max_length=block_size)
    return out


def gpt_config_from_hf(hf: dict, bias: bool = True) -> GPTConfig:
    """Our GPTConfig for a HF GPT-2 ``config.json``; ValueError where our GPT cannot match it."""
    act = hf.get("activation_function", "gelu_new")
    checks = {
        "activation_function": act in ("gelu_new", "gelu_pytorch_tanh"),
        "n_inner": hf.get("n_inner") in (None, 4 * hf["n_embd"]),
        "layer_norm_epsilon": abs(hf.get("layer_norm_epsilon", 1e-5) - 1e-5) < 1e-12,
        "scale_attn_weights": hf.get("scale_attn_weights", True),
        "tie_word_embeddings": hf.get("tie_word_embeddings", True),
        "add_cross_attention": not hf.get("add_cross_attention", False),
    }
    bad = [f"{k}={hf.get(k)!r}" for k, ok in checks.items() if not ok]
    if bad:
        raise ValueError(
            f"this GPT-2 config cannot be loaded into our GPT ({', '.join(bad)}); supported: "
            "tanh GELU, n_inner = 4 n_embd, LayerNorm eps 1e-5, scaled and tied attention/embeddings"
        )
    return GPTConfig(
        name=hf.get("_name_or_path") or "hf-gpt2",
        block_size=hf["n_positions"],
        vocab_size=hf["vocab_size"],
        n_layer=hf["n_layer"],
        n_head=hf["n_head"],
        n_embd=hf["n_embd"],
        dropout=0.0,
        bias=bias,
        scale_attn_by_inverse_layer_idx=bool(hf.get("scale_attn_by_inverse_layer_idx", False)),
    )


def from_hf_state_dict(state: dict[str, torch.Tensor], bias: bool) -> dict[str, torch.Tensor]:
    """HF GPT-2 tensors as our state dict (biases dropped when ``bias`` is False)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        name = name.removeprefix("transformer.")
        if name.endswith((".attn.bias", ".attn.masked_bias")) or name == "lm_head.weight":
            continue  # causal-mask buffers of old checkpoints; the head is tied
        if not bias and name.endswith(".bias"):
            continue
        t = t.float()
        if name.endswith(_CONV1D):
            t = t.t()
        out[f"transformer.{name}"] = t.contiguous()
    out["lm_head.weight"] = out["transformer.wte.weight"]
    return out


def read_hf_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors of a HF model directory: model.safetensors, else pytorch_model.bin."""
    d = Path(path)
    if (d / "model.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(str(d / "model.safetensors"))
    if (d / "pytorch_model.bin").is_file():
        return torch.load(d / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise FileNotFoundError(
        f"{d} has no model.safetensors or pytorch_model.bin (sharded checkpoints are not "
        "supported: save it with save_pretrained(..., max_shard_size='100GB'))"
    )


def is_hf_dir(path: str | Path) -> bool:
    """Whether ``path`` looks like a HF model directory (a config.json next to weights)."""
    p = Path(path)
    return p.is_dir() and (p / "config.json").is_file()


def load_hf(path: str | Path) -> CausalLM:
    """Our model with the weights of the HF directory ``path`` (fp32, eval mode): a GPT-2
    (``model_type`` gpt2) or a LLaMA (``llama``, model/hf_llama.py)."""
    d = Path(path)
    if not is_hf_dir(d):
        raise FileNotFoundError(f"{d} is not a Hugging Face model directory (no config.json)")
    hf = json.loads((d / "config.json").read_text())
    kind = hf.get("model_type", "gpt2")
    if kind == "llama":
        from model import hf_llama

        model = hf_llama.model_from_hf(hf, read_hf_weights(d), str(d))
    elif kind == "gpt2":
        model = _gpt2_from_hf(hf, read_hf_weights(d), str(d))
    else:
        raise ValueError(f"{d} holds a {kind!r} model; supported: gpt2, llama")
    log.info("loaded %s: %.2fM parameters", d, model.num_params() / 1e6)
    return model.eval()


def _gpt2_from_hf(hf: dict, state: dict[str, torch.Tensor], source: str) -> GPT:
    biases = [t for k, t in state.items() if k.endswith(".bias") and ".attn.bias" not in k]
    bias = any(bool(t.any()) for t in biases if t.is_floating_point())
    model = GPT(gpt_config_from_hf(hf, bias=bias))
    ours = from_hf_state_dict(state, bias)
    missing, unexpected = model.load_state_dict(ours, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{source}: weights do not fit (missing {missing}, unexpected {unexpected})"
        )
    return model
