"""The study's figures, from results.csv rows and curves.csv.gz alone.

- ``curves.png`` (the headline): per main cell, every optimizer's evaluation runs at its chosen
  values, training loss against tokens (thin lines, one per seed) with the validation losses
  (dots), beside the collapse floor; a collapse reads as a curve that leaves and comes back up,
  a plateau as one that never leaves.
- ``study.png``: left, each optimizer's lr line on the selection seeds (mean over them, the
  final values of the other knobs); right, AdamW's mean end loss across budgets with every
  optimizer's evaluation seeds at its budget, and the n-gram floors.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from analysis.colours import COLOURS, colour_of  # noqa: F401 - re-exported for the study's figures
from study.tables import BASELINE, eval_losses, tuned_knobs


def _plt():  # noqa: ANN202
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _colours(rows: list[dict]) -> dict:
    names = sorted({r["optimizer"] for r in rows})
    return {o: colour_of(o, names) for o in names}


def curves_figure(rows: list[dict], curves: dict, floors: dict, main_budgets: list[float],
                  path: Path) -> bool:  # fmt: skip
    """The headline figure (module docstring); False when no evaluation run has a curve."""
    chosen = [r for r in rows if r["role"] == "eval" and r.get("chosen") == 1.0]
    # a cell merged from another study (--merge) keeps its curves there: no empty panel here
    cells = sorted({(r["model"], r["budget"]) for r in chosen
                    if r["budget"] in main_budgets and curves.get(r["run_dir"])})  # fmt: skip
    if not cells:
        return False
    plt = _plt()
    fig, axes = plt.subplots(1, len(cells), figsize=(6.5 * len(cells), 4.4), squeeze=False)
    colour = _colours(rows)
    for ax, (model, budget) in zip(axes[0], cells):
        seen = set()
        for r in sorted(chosen, key=lambda r: (r["optimizer"], r["seed"])):
            if (r["model"], r["budget"]) != (model, budget):
                continue
            recs = curves.get(r["run_dir"], [])
            train = [
                (c["tokens"], c["loss"]) for c in recs if c["kind"] == "train" and "tokens" in c
            ]
            val = [(c["tokens"], c["loss"]) for c in recs if c["kind"] == "val" and c.get("tokens")]
            label = None if r["optimizer"] in seen else r["optimizer"]
            seen.add(r["optimizer"])
            if train:
                ax.plot(
                    *zip(*train), "-", lw=0.7, alpha=0.7, color=colour[r["optimizer"]], label=label
                )
            if val:
                ax.plot(*zip(*val), "o", ms=3, color=colour[r["optimizer"]])
        floor = floors.get("collapse_floor")
        if floor is not None and math.isfinite(floor):
            ax.axhline(floor, ls=":", c="gray")
            ax.text(ax.get_xlim()[0], floor, " collapse floor (bigram)", va="bottom", fontsize=7)
        ax.set_ylim(top=min(4.0, ax.get_ylim()[1]))
        ax.set_title(f"{model} at {budget:g}x: evaluation seeds at the chosen values", fontsize=9)
        ax.set_xlabel("training tokens")
        ax.set_ylabel("loss (nats/byte): train (lines), validation (dots)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _lr_line(rs: list[dict], chosen: dict | None) -> list[tuple[float, float]]:
    """(lr, mean over the selection seeds) along the lr line at the chosen other knobs."""
    others = [k for k in tuned_knobs(rs) if k != "lr"]
    if chosen:
        rs = [r for r in rs if all(math.isclose(r[k], chosen[k]) for k in others)]
    by_lr: dict = defaultdict(list)
    for r in rs:
        x = r["final_val_loss"]
        by_lr[r["lr"]].append(x if isinstance(x, float) and math.isfinite(x) else math.nan)
    return sorted((lr, float(np.mean(v))) for lr, v in by_lr.items())


def study_figure(rows: list[dict], floors: dict, path: Path) -> None:
    """The overview figure (module docstring)."""
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    colour = _colours(rows)
    picks = {(r["optimizer"], r["model"], r["budget"]): r for r in rows
             if r["role"] == "eval" and r.get("chosen") == 1.0}  # fmt: skip
    groups: dict = defaultdict(list)
    for r in rows:
        if r["role"] == "select":
            groups[(r["optimizer"], r["model"], r["budget"])].append(r)
    first = min((r["budget"] for r in rows), default=1.0)
    for (opt, model, budget), rs in sorted(groups.items()):
        pts = _lr_line(rs, picks.get((opt, model, budget)))
        if pts:
            a.plot(*zip(*pts), "o-" if budget == first else "s--", ms=3, color=colour[opt],
                   alpha=1.0 if budget == first else 0.5, label=f"{opt} {model} {budget:g}x")  # fmt: skip
    a.set_xscale("log")
    a.set_xlabel("lr (the other knobs at their chosen values)")
    a.set_ylabel("final validation loss, mean of the selection seeds")
    a.legend(fontsize=6)
    losses = eval_losses(rows)
    tokens = {(r["model"], r["budget"]): r["tokens"] for r in rows if r["role"] == "eval"}
    for model in sorted({m for (_, m, _) in losses}):
        ref = sorted((tokens[(m, bu)], np.mean(list(s.values())))
                     for (o, m, bu), s in losses.items() if o == BASELINE and m == model)  # fmt: skip
        if ref:
            b.plot(*zip(*ref), "k-", lw=1, label=f"AdamW {model} (mean of seeds)")
    for i, ((opt, model, budget), seeds) in enumerate(sorted(losses.items())):
        x = tokens[(model, budget)] * (1 + 0.03 * (i % 5 - 2))
        b.plot([x] * len(seeds), list(seeds.values()), "o", ms=3, color=colour[opt],
               label=f"{opt} {model} {budget:g}x")  # fmt: skip
    for name in ("unigram", "bigram"):
        if name in floors:
            b.axhline(floors[name], ls=":", c="gray")
            b.text(b.get_xlim()[0], floors[name], f" {name} {floors[name]:.3f}", va="bottom",
                   fontsize=7)  # fmt: skip
    b.set_xscale("log")
    b.set_xlabel("training tokens")
    b.set_ylabel("final validation loss (evaluation seeds)")
    if b.get_legend_handles_labels()[0]:  # a study with no evaluation runs yet has no lines
        b.legend(fontsize=5, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def crossover_figure(rows: list[dict], preds: list[dict], path: Path, comparisons: list,
                     headline: str) -> None:  # fmt: skip
    """The crossover's measured effects against the batch (``comparisons``: study/findings/crossover_report.py's
    ``(name, colour arm, ...)``; ``headline``: the model drawn solid), with the predicted
    crossovers marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    models = sorted({r["model"] for r in rows}, key=lambda m: (m != headline, m))
    for (name, _base, _other), colour in zip(comparisons, (colour_of(c[1]) for c in comparisons)):
        for model, marker in zip(models, "osD^v"):
            rs = [r for r in rows if r["comparison"] == name and r["model"] == model]
            if rs:
                xs = [r["batch"] for r in rs]
                label = name if model == headline else f"{name} ({model})"
                ax.errorbar(xs, [r["mean"] for r in rs], marker=marker, color=colour, label=label,
                            ls="-" if model == headline else "--",
                            yerr=[[r["mean"] - r["lo"] for r in rs],
                                  [r["hi"] - r["mean"] for r in rs]])  # fmt: skip
    finite = [p["crossover"] for p in preds if math.isfinite(p["crossover"])]
    for x in sorted(set(finite)):
        ax.axvline(x, color="grey", ls=":", lw=0.8)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch (bytes), 966 steps at each")
    ax.set_ylabel("final validation loss difference")
    ax.set_title("below 0: the first arm is better (dotted: predicted crossovers)", fontsize=9)
    if rows:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
