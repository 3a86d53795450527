"""MARS-AdamW's loss taken apart (docs/study.md, "MARS-AdamW's loss"): at the values a study
chose for MARS-AdamW (its results.csv), on the evaluation seeds, without tuning:

- gamma {chosen, 0} x betas {MARS-AdamW's (0.95, its beta2), AdamW's (0.9, AdamW's beta2)} x the
  gains' weight decay (``weight_decay_1d``) {0.1, 0}: the eight corners (the all-MARS corner is
  the study's own MARS-AdamW cell, merged, not rerun);
- exact mode once, and a batch of 8,192 tokens once (4x the study's: the budget's tokens in a
  quarter of the steps).

    python -m study.factorial --from runs/referee/results.csv [--out runs/referee-factorial]
                              [study options, e.g. --jobs 2] [-- train.py overrides]

It is ``python -m study`` with these cells, ``--untuned`` at ``--center-from`` the given file,
and that file's AdamW and MARS-AdamW cells merged, so the report pairs every corner with both.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

BASE = "mars-adamw"


def variants(chosen: dict, adamw_beta2: float) -> list[str]:
    """The factorial's cells (variant names) at ``chosen`` (MARS-AdamW's knob values)."""
    gamma = chosen.get("gamma", 0.025)
    mars_betas = f"[0.95,{chosen['beta2']!r}]"
    adamw_betas = f"[0.9,{adamw_beta2!r}]"
    out = []
    for g in (gamma, 0.0):
        for betas in (mars_betas, adamw_betas):
            for wd1 in (0.1, 0.0):
                if g == gamma and betas == mars_betas and wd1 == 0.1:
                    continue  # the study's own cell
                out.append(f"{BASE}:gamma={g!r},betas={betas},weight_decay_1d={wd1!r}")
    return out + [f"{BASE}:mode=exact", f"{BASE}:batch_tokens=8192"]


def main(argv: list[str] | None = None) -> int:
    from study import cli
    from study.results import read_csv

    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m study.factorial", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--from", dest="source", type=Path, required=True, metavar="CSV")
    ap.add_argument("--out", type=Path, default=Path("runs/referee-factorial"))
    ap.add_argument("--center-cell", default=None, metavar="MODEL:BUDGET")
    args, rest = ap.parse_known_args(argv)
    if not args.source.is_file():
        raise SystemExit(f"study.factorial: --from {args.source}: no such file")
    rows = [r for r in read_csv(args.source) if r["role"] == "eval" and r.get("chosen") == 1.0]
    picks = {r["optimizer"]: r for r in rows}
    if BASE not in picks or "adamw" not in picks:
        raise SystemExit(f"study.factorial: {args.source} has no chosen {BASE} or adamw cell yet")
    cells = variants(picks[BASE], picks["adamw"].get("beta2", 0.95))
    model, budget = picks[BASE]["model"], picks[BASE]["budget"]
    study_args = ["--out", str(args.out), "--optimizers", *cells, "--untuned", *cells,
                  "--models", model, "--budgets", f"{budget:g}", "--reference-budgets",
                  "--center-from", str(args.source), "--center-cell", f"{model}:{budget:g}",
                  "--merge", str(args.source), "--merge-only", "adamw", BASE, *rest]  # fmt: skip
    return cli.main(study_args)


if __name__ == "__main__":
    raise SystemExit(main())
