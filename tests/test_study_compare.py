"""study.compare: cells side by side, with planted answers (an order that holds, one that flips,
a gap that shrinks by a known slope per doubling of N)."""

from __future__ import annotations

import math

import pytest

from study.compare import (
    cells_of,
    gap_changes,
    main,
    pair_tests,
    pair_verdict,
    parse_source,
    render,
)
from study.results import write_csv

SEEDS = [1, 2, 3, 4, 5]
NOISE = {1: 0.011, 2: -0.007, 3: 0.004, 4: -0.013, 5: 0.006}


def rows(model: str, params: int, gaps: dict[str, float], *, budget: float = 0.25,
         collapsed: tuple = ()) -> list[dict]:  # fmt: skip
    """Evaluation rows of one cell: AdamW at 2.0 + a per-seed shift, each other optimizer at
    AdamW + its gap + a small per-seed wobble of its own."""
    out = []
    for i, (opt, gap) in enumerate({"adamw": 0.0, **gaps}.items()):
        for s in SEEDS:
            loss = 2.0 + 0.05 * s + gap + (0.0 if opt == "adamw" else NOISE[s] * (i % 3) / 2)
            out.append({"optimizer": opt, "model": model, "budget": budget, "role": "eval",
                        "non_embedding_params": float(params), "tokens": 5.0 * params,
                        "batch_tokens": 2048.0, "chosen": 1.0, "seed": float(s),
                        "final_val_loss": loss, "collapsed": float((opt, s) in collapsed),
                        "lr": 0.004 * (i + 1), "wd": 0.1})  # fmt: skip
    # a selection row and an unchosen evaluation row, which the comparison ignores
    out.append({**out[0], "role": "select", "seed": 0.0, "final_val_loss": 9.0})
    out.append({**out[0], "chosen": 0.0, "final_val_loss": 9.0})
    return out


def test_order_holds_and_flips():
    a = cells_of("a", rows("m", 1000, {"muon": -0.3, "mars-adamw": 0.1}))
    b = cells_of("b", rows("m", 1000, {"muon": -0.25, "mars-adamw": -0.1}))
    cells = a + b
    assert [c.label for c in cells] == ["a", "b"]
    tests = pair_tests(cells)
    _, verdict = pair_verdict(cells, tests, "adamw", "muon")
    assert verdict.startswith("same order in all 2 cells, holds in all (muon lower)")
    shown, verdict = pair_verdict(cells, tests, "adamw", "mars-adamw")
    assert "flips" in verdict
    assert shown[0].startswith("+0.100") and shown[1].startswith("-0.100")
    text = render(cells, ["a=x", "b=y"])
    assert "- a: muon < adamw < mars-adamw" in text
    assert "- b: muon < mars-adamw < adamw" in text
    assert "Not in every cell" not in text
    assert "## Chosen values in each cell (lr, wd)" in text
    assert "| muon | 0.008, 0.1 | 0.008, 0.1 |" in text
    c = cells_of("c", rows("m", 1000, {"muon": -0.2}))
    assert "**Not in every cell:** mars-adamw (not in c)." in render(cells + c, ["a", "b", "c"])


def test_gap_change_and_slope_per_doubling():
    sizes = [1000, 2000, 4000]
    cells = []
    for n in sizes:  # the gap shrinks by exactly 0.05 per doubling of N, on every seed
        cells += cells_of(f"n{n}", rows(f"p{n}", n, {"muon": -0.1 - 0.05 * math.log2(n / 1000)}))
    assert [c.params for c in cells] == sizes
    lines, notes = gap_changes(cells)
    muon = next(line for line in lines if line.startswith("| muon |"))
    cols = [c.strip() for c in muon.strip("|").split("|")]
    assert cols[1].startswith("-0.050") and cols[2].startswith("-0.100")
    assert cols[3].startswith("-0.050 [-0.050, -0.050]")  # the slope, the same on every seed
    assert "per doubling of N" in lines[0] and "log2 N" in notes[1]


def test_one_file_many_cells_and_collapses(tmp_path):
    path = tmp_path / "results.csv"
    write_csv(rows("p1", 1000, {"muon": -0.3}) + rows("p2", 2000, {"muon": -0.2},
              collapsed=(("muon", 3),)), path)  # fmt: skip
    assert main([f"ladder={path}", "--out", str(tmp_path / "c.md"),
                 "--figure", str(tmp_path / "c.png")]) == 0  # fmt: skip
    text = (tmp_path / "c.md").read_text()
    assert "| ladder p1 0.25x | p1 | 1,000 |" in text and "ladder p2 0.25x" in text
    assert "1/5 collapsed" in text
    assert (tmp_path / "c.png").stat().st_size > 0
    one = cells_of("x", rows("p1", 1000, {"muon": -0.3}) + rows("p2", 2000, {"muon": -0.2}),
                   ("p2", 0.25))  # fmt: skip
    assert [c.label for c in one] == ["x"] and one[0].model == "p2"


def test_bad_sources_say_what_is_wrong(tmp_path, capsys):
    with pytest.raises(ValueError, match="LABEL=PATH"):
        parse_source("results.csv")
    with pytest.raises(ValueError, match="MODEL:BUDGET"):
        parse_source("a=r.csv@proxy-100k:big")
    assert parse_source("a=r.csv@proxy-100k:0.25x")[2] == ("proxy-100k", 0.25)
    with pytest.raises(
        ValueError, match=r"no comparison cell p9:1: .*\(cells: p1:0.25 \(2 evaluated\)\)"
    ):
        cells_of("a", rows("p1", 1000, {"muon": -0.3}), ("p9", 1.0))
    only_adamw = [r for r in rows("p1", 1000, {"muon": -0.3}) if r["optimizer"] == "adamw"]
    with pytest.raises(
        ValueError, match=r"two optimizers evaluated \(cells: p1:0.25 \(1 evaluated"
    ):
        cells_of("a", only_adamw, ("p1", 0.25))  # a part still running: its other optimizer later
    assert main([f"a={tmp_path / 'none.csv'}"]) == 2
    assert "no results.csv at" in capsys.readouterr().err
