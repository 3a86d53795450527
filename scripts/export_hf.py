"""Export a checkpoint as a Hugging Face GPT2LMHeadModel (or, for a LLaMA-style model,
LlamaForCausalLM) directory.

    python -m scripts.export_hf runs/NAME out/NAME-hf
    python -m scripts.export_hf runs/NAME/checkpoints/step_0100000.pt out/hf --keep-vocab-padding
    lm_eval --model hf --model_args pretrained=out/NAME-hf --tasks hellaswag   # where lm-eval runs

Writes config.json (with scale_attn_by_inverse_layer_idx as the model has it), model.safetensors,
generation_config.json and the GPT-2 tokenizer files rebuilt from data/gpt2.tiktoken. The
vocabulary is cut to GPT-2's 50,257 real tokens unless --keep-vocab-padding. With transformers
installed the export is checked: the exported model's logits must equal ours (--no-check skips).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from data.tokenizer import VOCAB_SIZE, encode
from evals.loading import load_model
from model.hf import save_hf

CHECK_TEXT = "The MARS optimizer reduces the variance of stochastic gradients. Hello world!"


@torch.no_grad()
def check_export(model: torch.nn.Module, out_dir: Path) -> float:
    """Max |logit difference| between ``model`` and the export loaded by transformers."""
    from transformers import AutoModelForCausalLM  # GPT2LMHeadModel or LlamaForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(out_dir).float().eval()
    ids = torch.tensor([encode(CHECK_TEXT)[: model.config.block_size]])
    ours = model.float()(ids)[0]
    theirs = hf(ids).logits
    vocab = min(ours.size(-1), theirs.size(-1), VOCAB_SIZE)
    return (ours[..., :vocab] - theirs[..., :vocab]).abs().max().item()


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(prog="python -m scripts.export_hf", description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)  # fmt: skip
    ap.add_argument(
        "checkpoint", help="a step_N.pt file, a DCP step_N directory or a run directory"
    )
    ap.add_argument("out_dir", help="the directory to write")
    ap.add_argument("--keep-vocab-padding", action="store_true", help="export all 50,304 rows")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--no-check", action="store_true", help="skip the transformers check")
    args = ap.parse_args(argv)
    if Path(args.out_dir).exists() and not Path(args.out_dir).is_dir():
        raise SystemExit(f"error: {args.out_dir} is a file: name a directory to write the export "
                         "into (new, or one to overwrite)")  # fmt: skip
    try:
        loaded = load_model(args.checkpoint, "cpu")
        out = save_hf(
            loaded.model, args.out_dir, keep_vocab_padding=args.keep_vocab_padding, dtype=args.dtype
        )
    except (FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
    except OSError as exc:  # a read-only mount, a full disk, no permission: the storage's error
        raise SystemExit(f"error: cannot write the export into {args.out_dir}: "
                         f"{exc.strerror or exc} (a read-only or full file system, or no "
                         "permission there): name another out_dir") from None  # fmt: skip
    print(f"wrote {out} from {loaded.source} (step {loaded.step})")
    if args.no_check:
        return out
    try:
        diff = check_export(loaded.model, out)
    except ImportError:
        print("transformers is not installed: skipped the logits check")
        return out
    print(f"check: transformers' logits differ from ours by at most {diff:.2e}")
    if args.dtype == "float32" and diff > 1e-4:  # reduced-precision exports differ by rounding
        raise SystemExit(f"error: exported logits differ from ours by {diff:.3e} (> 1e-4)")
    return out


if __name__ == "__main__":
    main()
