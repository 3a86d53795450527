"""Validation-loss and loss-fit figures of ``python -m report`` (matplotlib, Agg canvas, PNG).

Figures are drawn through matplotlib's object interface on an Agg canvas (no pyplot, so no
global state and no display is needed).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from analysis.colours import LABEL_COLOURS, LABELS, colour_of

# One colour per optimizer in every figure of the project (analysis/colours.py).
COLORS = {label: colour_of(label) for label in (*LABELS, *LABEL_COLOURS)}
# A curve's first point is left above the axis only when showing it would make the axis more than
# this many times the range of every other point (see ``y_limits``).
STRETCH = 3.0


def color_of(label: str, others: list[str]) -> str:
    """The optimizer's fixed colour; ``others`` (sorted labels) share the spares."""
    return colour_of(label, others)


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


def y_limits(series: list[dict]) -> tuple[float, float, list[str]]:
    """Y-limits that show every point (band included), and the points left above them.

    The only points ever cut are step-0 evaluations (the untrained model's ~10.9; a series with
    ``step0`` true starts with one), and only when they would stretch the axis to more than
    ``STRETCH`` times the range of all other points, which would flatten the differences that
    matter. The cut points are returned as text for the caption.
    """
    rest_lo = [float(np.min(s["lo"][1:])) for s in series if len(s["x"]) > 1]
    rest_hi = [float(np.max(s["hi"][1:])) for s in series if len(s["x"]) > 1]
    cut: set[int] = set()
    if rest_lo:
        low, high = min(rest_lo), max(rest_hi)
        span = max(high - low, 0.02)
        cut = {
            i
            for i, s in enumerate(series)
            if s.get("step0") and float(s["hi"][0]) - low > STRETCH * span
        }
    kept = [s for i, s in enumerate(series) if i not in cut]
    low = min(rest_lo + [float(s["lo"][0]) for s in kept])
    high = max(rest_hi + [float(s["hi"][0]) for s in kept])
    span = high - low if high > low else 0.02
    notes = [f"{series[i]['label']} {float(series[i]['hi'][0]):.2f}" for i in sorted(cut)]
    return low - 0.05 * span, high + 0.05 * span, notes


# One marker per curve (hollow, so a curve under another still shows), in the series' order.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")
ZOOM_FROM = 0.6  # the zoomed panel shows the last 40% of the x axis, where the curves part


def plot_val_loss(series: list[dict], *, xlabel: str, title: str, path: Path) -> str | None:
    """One PNG: per series (``label``, ``x``, ``mean``, ``lo``, ``hi``, ``n_seeds``, optional
    ``unfinished`` and ``step0``) the seed mean as a line with its own hollow marker on each
    evaluation and the min-max over seeds as a shaded band; beside it a panel zoomed on the
    last part of the run (``ZOOM_FROM``), where the differences are. Returns the caption naming
    the points above the axis, if any."""
    if not series:
        raise ValueError(f"no curves to plot for {path.name}")
    zoom = zoom_limits(series)
    fig = Figure(figsize=(11.0 if zoom else 7.0, 4.5), dpi=120)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, width_ratios=(3, 2)) if zoom else [fig.add_subplot()]
    for ax in axes:
        _draw(ax, series)
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
    low, high, cut = y_limits(series)
    axes[0].set_ylim(low, high)
    axes[0].set_ylabel("validation loss")
    axes[0].set_title(title)
    axes[0].legend()
    if zoom:
        (x0, x1), (y0, y1) = zoom
        axes[1].set_xlim(x0, x1)
        axes[1].set_ylim(y0, y1)
        axes[1].set_title(f"zoom: the last {1 - ZOOM_FROM:.0%} of the run", fontsize=10)
    caption = None
    if cut:
        caption = "step-0 loss above the axis (not shown): " + ", ".join(cut)
        fig.text(0.01, 0.01, caption, fontsize=7, color="dimgray")
    fig.tight_layout(rect=(0, 0.03 if cut else 0, 1, 1))
    fig.savefig(path, format="png")
    return caption


def _draw(ax, series: list[dict]) -> None:
    others = sorted(s["label"] for s in series if s["label"] not in COLORS)
    for k, s in enumerate(series):
        color = color_of(s["label"], others)
        notes = ([f"{s['n_seeds']} seeds"] if s["n_seeds"] > 1 else []) + (
            ["unfinished"] if s.get("unfinished") else []
        )
        name = s["label"] + (f" ({', '.join(notes)})" if notes else "")
        ax.plot(s["x"], s["mean"], color=color, linewidth=1.4, marker=MARKERS[k % len(MARKERS)],
                markersize=5, markerfacecolor="none", label=name)  # fmt: skip
        if s["n_seeds"] > 1:
            ax.fill_between(s["x"], s["lo"], s["hi"], color=color, alpha=0.2, linewidth=0)


def zoom_limits(series: list[dict]):
    """((x0, x1), (y0, y1)) of the zoomed panel: x over the last part of the longest run, y
    over every point (bands included) there; None when that part holds fewer than 2 points."""
    x_max = max((float(np.max(s["x"])) for s in series if len(s["x"])), default=0.0)
    x0 = ZOOM_FROM * x_max
    inside = [(s["lo"][s["x"] >= x0], s["hi"][s["x"] >= x0]) for s in series if len(s["x"])]
    if x_max <= 0 or sum(len(lo) for lo, _ in inside) < 2:
        return None
    low = min(float(np.min(lo)) for lo, _ in inside if len(lo))
    high = max(float(np.max(hi)) for _, hi in inside if len(hi))
    pad = 0.08 * (high - low if high > low else 0.02)
    return (x0 - 0.02 * x_max, x_max * 1.02), (low - pad, high + pad)


def scaled(curve: dict[str, np.ndarray], divisor: float) -> dict[str, np.ndarray]:
    """A copy of ``curve`` with x divided by ``divisor`` (tokens -> billions, s -> hours)."""
    return {**curve, "x": curve["x"] / divisor}


def plot_loss_fits(laws: list[dict], *, title: str, path: Path) -> None:
    """One PNG, log-x: per optimizer (``optimizer``, ``points`` with ``compute``, ``mean`` and
    ``bests``, ``law`` with ``l_inf``, ``a``, ``alpha`` or None) the seed means as markers with
    the min-max over seeds as error bars, and the fitted ``L(C) = l_inf + a C^-alpha`` as a line
    over the points' range and a little beyond."""
    if not laws:
        raise ValueError(f"no fits to plot for {path.name}")
    fig = Figure(figsize=(7.0, 4.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    others = sorted(f["optimizer"] for f in laws if f["optimizer"] not in COLORS)
    computes = [p["compute"] for f in laws for p in f["points"]]
    grid = np.geomspace(min(computes) / 1.5, max(computes) * 1.5, 100)
    for f in laws:
        color = color_of(f["optimizer"], others)
        c = np.array([p["compute"] for p in f["points"]])
        mean = np.array([p["mean"] for p in f["points"]])
        err = np.array(
            [[m - min(p["bests"]), max(p["bests"]) - m] for m, p in zip(mean, f["points"])]
        ).T
        law = f["law"]
        name = f["optimizer"]
        if law is not None:
            name += f": {law['l_inf']:.2f} + {law['a']:.3g} C^-{law['alpha']:.3f}"
            fitted = law["l_inf"] + law["a"] * np.power(grid, -law["alpha"])
            ax.plot(grid, fitted, color=color, linewidth=1.4)
        ax.errorbar(
            c,
            mean,
            yerr=err,
            color=color,
            marker="o",
            markersize=4,
            linestyle="none",
            capsize=2,
            label=name,
        )
    ax.set_xscale("log")
    ax.set_xlabel("training compute C (FLOPs)")
    ax.set_ylabel("best validation loss")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png")
