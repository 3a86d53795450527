"""The LayerNorm gains along a run, read from its checkpoints: does a decay of the gains hold them
down while the model learns fastest? (docs/study.md, "How to read the chain").

    python -m study gains RUN_DIR [RUN_DIR ...] --out results/crossover/checks/gains

Each run directory needs checkpoints along the run (``ckpt_every=48 keep_checkpoints=0``). For
each checkpoint (read as training reads one: ``weights_only``, its checksum verified) the gains
(every 1-D weight whose name holds ``ln``): the mean over all their elements and the smallest
tensor's mean. Writes ``OUT.json`` (one entry per run: its label, command, commit, optimizer
values, final validation loss, and the gains at each checkpoint's step) and ``OUT.md`` (a table at
a few steps); prints the table. Nothing machine-specific is written (the run directory by name
only).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

STEPS_SHOWN = (48, 192, 384, 480, 720, 960)  # (checkpoints every 48 steps of 966)
OPTIMIZER_KEYS = ("name", "lr", "aux_lr", "weight_decay", "weight_decay_1d", "gamma", "betas")


def gains_of(model: dict) -> tuple[float, float]:
    """``(mean over every gain element, the smallest gain tensor's mean)`` of a model state."""
    gains = [t.double() for name, t in model.items() if t.dim() == 1 and ".ln" in f".{name}"]
    if not gains:
        raise SystemExit("no LayerNorm gains (1-D weights named *ln*) in the checkpoint")
    total = sum(float(t.sum()) for t in gains) / sum(t.numel() for t in gains)
    return total, min(float(t.mean()) for t in gains)


def trajectory(run: Path) -> dict:
    """One run's entry (module docstring)."""
    from trainer.checkpoint import list_checkpoints, load_checkpoint

    ckpts = [p for p in list_checkpoints(run) if p.suffix == ".pt"]
    if not ckpts:
        raise SystemExit(f"{run}: no checkpoints; train with ckpt_every=48 keep_checkpoints=0")
    if not (run / "meta.jsonl").is_file():
        raise SystemExit(f"{run}: no meta.jsonl; give a run directory train.py wrote")
    points, config = [], {}
    for path in ckpts:
        try:
            c = load_checkpoint(path)  # checksum verified, weights_only
        except ValueError as exc:  # damaged, truncated or not ours: one line, nothing written
            raise SystemExit(str(exc)) from None
        mean, smallest = gains_of(c["model"])
        points.append({"step": int(c["step"]), "mean": mean, "smallest": smallest})
        config = c["config"]
    meta = json.loads((run / "meta.jsonl").read_text().splitlines()[0])
    summary = run / "summary.json"
    final = json.loads(summary.read_text()).get("final_val_loss") if summary.is_file() else None
    opt = config.get("optimizer", {})
    return {
        "run": run.name,
        "command": " ".join(a for a in meta["argv"] if not a.startswith("out_dir=")),
        "commit": meta["git_commit"] + ("+dirty" if meta.get("git_dirty") else ""),
        "optimizer": {k: opt[k] for k in OPTIMIZER_KEYS if k in opt},
        "final_val_loss": final,
        "gains": points,
    }


def table(runs: list[dict]) -> str:
    """Markdown: each run's mean gain (smallest tensor's mean) at ``STEPS_SHOWN``."""
    head = "| run | lr | gains' decay | " + " | ".join(f"step {s}" for s in STEPS_SHOWN)
    rows = [head + " | final val loss |", "|---" * (len(STEPS_SHOWN) + 4) + "|"]
    for r in runs:
        at = {p["step"]: p for p in r["gains"]}
        cells = [f"{at[s]['mean']:.3f} ({at[s]['smallest']:.3f})" if s in at else "-"
                 for s in STEPS_SHOWN]  # fmt: skip
        opt, loss = r["optimizer"], r["final_val_loss"]
        decay = opt.get("weight_decay_1d", 0.0 if opt.get("name") == "adamw" else "default")
        rows.append(f"| {r['run']} | {opt.get('lr')} | {decay} | " + " | ".join(cells)
                    + f" | {'-' if loss is None else f'{loss:.4f}'} |")  # fmt: skip
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m study gains", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("runs", nargs="+", type=Path, help="run directories with checkpoints")
    ap.add_argument("--out", type=Path, default=None, help="OUT: writes OUT.json and OUT.md")
    args = ap.parse_args(argv)
    runs = [trajectory(r) for r in args.runs]
    text = table(runs)
    print(text, end="")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(runs, indent=1) + "\n")
        note = ("The LayerNorm gains along each run: the mean over every gain element, in "
                "brackets the smallest gain tensor's mean (`python -m study gains`; the runs' "
                f"commands and commits in [{args.out.name}.json]({args.out.name}.json)).\n\n")  # fmt: skip
        args.out.with_suffix(".md").write_text(note + text)
        print(f"wrote {args.out.with_suffix('.json')}, {args.out.with_suffix('.md')}")
    return 0
