"""What a report cell or figure says in the cases a first user met (issue 30): a token column before
the first evaluation, a run in progress, a wall-clock target not reached, curves on top of each
other, and differences too small to see on the whole loss axis."""

import numpy as np
from matplotlib.figure import Figure

from analysis.time_to_loss import time_to_loss_speedup
from report import figures
from report.render import render_val_loss
from report.time_to_loss import cell_text


def cell(column, mean):
    return {"column": column, "size": "tiny", "mean": mean, "std": None, "reached": True,
            "paper": None, "paper_approximate": False, "diff": None}  # fmt: skip


def test_a_token_column_before_every_first_evaluation_is_left_out_and_said():
    section = {
        "columns": [{"label": "1M", "tokens": 1e6}, {"label": "4M", "tokens": 4e6}],
        "sizes": ["tiny"],
        "rows": [{"optimizer": "AdamW", "cells": [cell("1M", None), cell("4M", 6.3)]}],
    }
    text = render_val_loss(section)
    header = text.splitlines()[0]
    assert "4M" in header and "1M" not in header
    assert "Left out: 1M, columns that come before the first evaluation" in text


def curves(x, *seeds):
    return np.asarray(x, dtype=float), np.asarray(seeds, dtype=float)


def test_a_baseline_with_only_its_step_0_evaluation_is_in_progress_not_infinite():
    base = curves([0.0], [10.9], [10.9])
    other = curves([0.0, 1e6], [10.9, 7.0], [10.9, 7.1])
    c = time_to_loss_speedup(base, other, resamples=20)
    assert c["in_progress"] and c["ratio"] is None
    assert cell_text(c) == "in progress (no evaluation after step 0 yet)"
    c = time_to_loss_speedup(other, base, resamples=20)  # this run has no evaluation after step 0
    assert cell_text(c) == "in progress (no evaluation after step 0 yet)"


def test_not_reached_names_its_own_curves_best_and_the_target():
    """The wall-clock cell once quoted the tokens curve's best (6.228) for a target of 6.231."""
    base = curves([0.0, 10.0, 20.0], [10.9, 7.0, 6.231])
    other = curves([0.0, 10.0, 20.0], [10.9, 7.0, 6.300])
    text = cell_text(time_to_loss_speedup(base, other), best_loss=6.228)  # 6.228: another curve's
    assert text == "not reached (< 1.00x: more than its whole run; its best 6.300 > L* 6.231)"


def test_curves_have_their_own_hollow_markers_and_a_zoomed_panel(tmp_path):
    x = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    series = [{"label": name, "x": x, "mean": m, "lo": m, "hi": m, "n_seeds": 1, "step0": True}
              for name, m in (("AdamW", np.array([10.9, 7.0, 6.5, 6.30, 6.20])),
                              ("MARS-approx", np.array([10.9, 7.0, 6.5, 6.29, 6.19])))]  # fmt: skip
    ax = Figure().add_subplot()
    figures._draw(ax, series)
    markers = [line.get_marker() for line in ax.get_lines()]
    assert len(set(markers)) == 2 and all(ln.get_markerfacecolor() == "none"
                                          for ln in ax.get_lines())  # fmt: skip
    (x0, x1), (y0, y1) = figures.zoom_limits(series)
    assert 2.0 < x0 < 3.0 and x1 >= 4.0  # the last 40%
    assert 6.1 < y0 < 6.19 and 6.30 < y1 < 6.4  # the end's differences fill the panel
    figures.plot_val_loss(series, xlabel="tokens", title="t", path=tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 0


def test_a_gamma_schedule_is_its_own_row_not_a_variant_of_constant_gamma():
    from report.runs import optimizer_label

    assert optimizer_label({"name": "mars-adamw", "gamma_schedule": "constant"}) == "MARS-approx"
    scheduled = {"name": "mars-adamw", "gamma_schedule": "linear", "gamma_end": 0.0}
    assert optimizer_label(scheduled) == "MARS-approx (γ linear to 0)"
