"""Convert a DCP checkpoint directory (``checkpoint_format=dcp``) to the single-file format.

    python -m scripts.convert_checkpoint runs/NAME/checkpoints/step_0005000
    python -m scripts.convert_checkpoint runs/NAME/checkpoints/step_0005000 --out step_5000.pt
    python -m scripts.convert_checkpoint runs/NAME/checkpoints/step_0005000 --model-only

The file holds the same dict as a checkpoint that ``checkpoint_format=file`` writes (model,
optimizer state, step, data position, RNG, config), so everything that reads those reads it; by
default it is written beside the directory as ``step_N.pt``. ``--model-only`` leaves out the
optimizer state (eval.py and scripts/export_hf.py need only the model; such a file cannot resume
a run). eval.py and export_hf.py also read a DCP directory directly.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from trainer.checkpoint import check_checkpoint
from trainer.checksums import save_checksummed
from trainer.dcp_checkpoint import load_dcp


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(prog="python -m scripts.convert_checkpoint", description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)  # fmt: skip
    ap.add_argument("checkpoint", help="a DCP checkpoint directory, RUN_DIR/checkpoints/step_N")
    ap.add_argument("--out", help="the file to write (default: the directory's name + .pt)")
    ap.add_argument("--model-only", action="store_true", help="leave out the optimizer state")
    args = ap.parse_args(argv)
    src = Path(args.checkpoint)
    out = Path(args.out) if args.out else src.with_name(src.name + ".pt")
    if out.resolve() == src.resolve() or out.is_dir():
        raise SystemExit(f"error: --out {out} is a directory; name a file, e.g. {src.name}.pt")
    if src.is_file():  # already the single-file format: nothing to convert
        raise SystemExit(f"error: {src} is a file checkpoint already (the single-file format "
                         "that eval.py, export and sample read as they are); convert takes a DCP "
                         "checkpoint directory, RUN_DIR/checkpoints/step_N")  # fmt: skip
    if not src.exists():
        raise SystemExit(f"error: {src}: no such checkpoint (a DCP directory, "
                         "RUN_DIR/checkpoints/step_N)")  # fmt: skip
    parts = ("model",) if args.model_only else ("model", "optimizer")
    try:
        c = load_dcp(src, parts=parts)
        if args.model_only:
            c["optimizer"] = {}  # the key stays, so the file passes load_checkpoint's check
        check_checkpoint(c, src)
    except (FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
    save_checksummed(c, out)  # with out.sha256 beside it, as train.py writes checkpoints
    print(f"wrote {out} (step {c['step']}) from {src}")
    return out


if __name__ == "__main__":
    main()
