"""Validation-loss figures of ``python -m report`` (matplotlib, Agg canvas, PNG).

Figures are drawn through matplotlib's object interface on an Agg canvas (no pyplot, so no
global state and no display is needed).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

# One colour per optimizer in every figure; other labels take the remaining tab10 colours.
COLORS = {
    "AdamW": "tab:blue",
    "Muon": "tab:orange",
    "Moonlight": "tab:purple",
    "MARS-exact": "tab:brown",
    "MARS-approx": "tab:red",
    "MARS-M": "tab:green",
    "MARS-M (γ=0.01)": "tab:olive",
    "MARS-M-exact": "tab:cyan",
}
SPARE = ("tab:pink", "tab:gray", "black", "gold", "navy", "teal")


def color_of(label: str, others: list[str]) -> str:
    """The paper optimizers' fixed colours; ``others`` (sorted labels) share the spares."""
    if label in COLORS:
        return COLORS[label]
    return SPARE[others.index(label) % len(SPARE)] if label in others else "black"


def token_axis(max_tokens: float) -> tuple[float, str]:
    """(divisor, axis label): billions of tokens, or millions for small runs."""
    if max_tokens >= 1e9:
        return 1e9, "tokens (billions)"
    return 1e6, "tokens (millions)"


def time_axis(max_seconds: float) -> tuple[float, str]:
    """(divisor, axis label): hours, or minutes/seconds for short (CPU) runs."""
    if max_seconds >= 2 * 3600:
        return 3600.0, "wall-clock hours"
    if max_seconds >= 120:
        return 60.0, "wall-clock minutes"
    return 1.0, "wall-clock seconds"


def focus_ylim(series: list[dict]) -> tuple[float, float]:
    """Y-limits around the interesting range: from the lowest value up to where the curves are
    after the first 10% of the x range (the step-0 loss and the first drop do not count)."""
    lows = [float(np.min(s["lo"])) for s in series]
    x_max = max(float(np.max(s["x"])) for s in series)
    highs = []
    for s in series:
        later = s["x"] >= 0.1 * x_max * (1 - 1e-9)
        values = s["hi"][later] if later.any() else s["hi"]
        if len(values) > 1 and not later.any():
            values = values[1:]
        highs.append(float(np.max(values)))
    low, high = min(lows), max(highs)
    span = high - low if high > low else 0.02
    return low - 0.05 * span, high + 0.05 * span


def plot_val_loss(series: list[dict], *, xlabel: str, title: str, path: Path) -> None:
    """One PNG: per series (``label``, ``x``, ``mean``, ``lo``, ``hi``, ``n_seeds``, optional
    ``unfinished``) the seed mean as a line and the min-max over seeds as a shaded band."""
    if not series:
        raise ValueError(f"no curves to plot for {path.name}")
    fig = Figure(figsize=(7.0, 4.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    others = sorted(s["label"] for s in series if s["label"] not in COLORS)
    for s in series:
        color = color_of(s["label"], others)
        notes = ([f"{s['n_seeds']} seeds"] if s["n_seeds"] > 1 else []) + (
            ["unfinished"] if s.get("unfinished") else []
        )
        name = s["label"] + (f" ({', '.join(notes)})" if notes else "")
        ax.plot(s["x"], s["mean"], color=color, linewidth=1.6, label=name)
        if s["n_seeds"] > 1:
            ax.fill_between(s["x"], s["lo"], s["hi"], color=color, alpha=0.2, linewidth=0)
    ax.set_ylim(*focus_ylim(series))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("validation loss")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, format="png")


def scaled(curve: dict[str, np.ndarray], divisor: float) -> dict[str, np.ndarray]:
    """A copy of ``curve`` with x divided by ``divisor`` (tokens -> billions, s -> hours)."""
    return {**curve, "x": curve["x"] / divisor}
