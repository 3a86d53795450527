"""Generate text from a checkpoint, to see what a model has learnt.

    python -m scripts.sample runs/NAME --prompt "The state of the Union is"
    python -m scripts.sample runs/NAME/checkpoints/step_0000150.pt -n 3 --temperature 0.7 --top-k 50
    python -m scripts.sample out/hf-gpt2 --prompt "Hello" --temperature 0     # greedy, HF directory

CHECKPOINT is a step_N.pt file, a run directory (its newest checkpoint) or a Hugging Face GPT-2
directory. Each sample is printed after a separator line. Temperature 0 (greedy decoding) has
one continuation: it is printed once, with a note when more samples were asked for.
"""

from __future__ import annotations

import argparse
import sys

from evals.loading import load_model
from model.sampling import sample_text
from runtime.device import resolve_dtype
from runtime.distributed import pick_device


def main(argv: list[str] | None = None) -> list[str]:
    ap = argparse.ArgumentParser(prog="python -m scripts.sample", description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)  # fmt: skip
    ap.add_argument("checkpoint", help="a step_N.pt file, a run directory or an HF directory")
    ap.add_argument("--prompt", default="", help="text to continue (default: a new document)")
    ap.add_argument("-n", "--num-samples", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=100)
    ap.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    ap.add_argument("--top-k", type=int, default=200, help="0: no top-k cut")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ap.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16")
    args = ap.parse_args(argv)
    if args.temperature == 0 and args.num_samples > 1:
        print(
            f"note: --temperature 0 is greedy decoding, so all {args.num_samples} samples would "
            "be the same text; printing it once (use a temperature > 0 for different samples)",
            file=sys.stderr,
        )
        args.num_samples = 1
    try:
        device = pick_device(args.device, 0)
        loaded = load_model(args.checkpoint, device)
        texts = sample_text(
            loaded.model,
            args.prompt,
            num_samples=args.num_samples,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k or None,
            seed=args.seed,
            device=device,
            dtype=resolve_dtype(args.dtype, device),
        )
    except (FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
    except KeyboardInterrupt:  # Ctrl-C while loading or sampling: nothing is written anyway
        sys.stderr.write("interrupted (Ctrl-C): no sample printed, nothing written\n")
        raise SystemExit(130) from None
    for text in texts:
        print("-" * 40)
        print(args.prompt + text)
    return texts


if __name__ == "__main__":
    main()
