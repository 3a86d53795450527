"""The README's results table is python -m study summary's output from the committed ledgers
(it cannot be typed by hand or go stale), and the summary reads a fixture ledger right."""

import csv

from analysis.colours import COLOURS, colour_of
from helpers import ROOT
from study import summary


def test_the_readmes_table_is_generated_from_the_ledgers():
    table = summary.markdown(summary.all_cells(ROOT / "results"))
    readme = (ROOT / "README.md").read_text()
    block = readme.split(summary.BEGIN, 1)[1].split(summary.END, 1)[0]
    assert block.strip() == table.strip(), "run: python -m study summary --readme README.md"


def test_a_fixture_ledger_gives_its_gap_and_speedup(tmp_path):
    rows = []
    for budget, tokens, base in ((1.0, 1000, 2.0), (2.0, 2000, 1.8), (4.0, 4000, 1.6)):
        for s in range(1, 6):
            rows.append({"optimizer": "adamw", "model": "p", "budget": budget, "tokens": tokens,
                         "seed": s, "role": "eval", "final_val_loss": base + 0.001 * s,
                         "chosen": 1, "batch_tokens": 2048, "run_dir": f"runs/a{budget}{s}"})  # fmt: skip
    for s in range(1, 6):
        rows.append({"optimizer": "muon", "model": "p", "budget": 1.0, "tokens": 1000, "seed": s,
                     "role": "eval", "final_val_loss": 1.8 + 0.001 * s, "chosen": 1,
                     "batch_tokens": 2048, "run_dir": f"runs/m{s}"})  # fmt: skip
    path = tmp_path / "referee" / "headline" / "results.csv"
    path.parent.mkdir(parents=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    cells = summary.all_cells(tmp_path)
    assert len(cells) == 1 and abs(cells[0].adamw - 2.003) < 1e-9
    g = cells[0].gaps["muon"]
    assert abs(g.mean + 0.2) < 1e-9 and g.hi - g.lo < 1e-9  # the same gap on every seed
    assert cells[0].speedups["muon"].startswith("2.00x")  # AdamW needs 2x the data for 1.8
    assert "| p, 1x, 2,048 B | 2.003 | - | -0.200" in summary.markdown(cells)


def test_every_figure_gives_an_optimizer_one_colour():
    from report.figures import COLORS

    same = {"adamw": "AdamW", "muon": "Muon", "moonlight": "Moonlight", "mars-adamw":
            "MARS-approx", "mars-m": "MARS-M"}  # fmt: skip
    for name, label in same.items():
        assert COLOURS[name] == COLORS[label]
    assert colour_of("mars-adamw") == colour_of("mars-adamw", ["zz", "mars-adamw"])
    assert len(set(COLOURS.values())) == len(COLOURS)


def test_one_family_counts_every_test_and_adjusts_them_together():
    from study.findings import family

    tests = family.family(ROOT / "results" / "referee", ROOT / "results" / "crossover")
    batches = family.crossover_losses(ROOT / "results" / "crossover")
    assert {"crossover b2048", "crossover b8192"} <= set(batches)  # finished batches: their tests
    kinds = {k: sum(t["kind"] == k for t in tests) for k in ("pair", "factorial", "across")}
    assert kinds == {"pair": 51 + 3 * len(batches), "factorial": 10, "across": 17}
    dg = [
        t
        for t in tests
        if t["test"] == "crossover b2048: proxy-100k 1x: mars-adamw:gamma=0 - mars-adamw"
    ]
    assert len(dg) == 1 and dg[0]["mean"] > 0  # gamma = 0 worse there: Delta_gamma < 0
    assert all(t["holm_p"] >= t["p"] for t in tests)
    narrowing = [t for t in tests if t["test"].startswith("batch 2,048 -> 8,192: mars-adamw")]
    assert len(narrowing) == 1 and narrowing[0]["p"] < 0.05 < 0.1 < narrowing[0]["holm_p"]
    text = (ROOT / "results" / "referee" / "family.md").read_text()
    assert text == family.markdown(tests), "run: python -m study family"


def test_the_family_takes_only_the_crossovers_finished_batches(tmp_path):
    """A batch with an arm short of its five evaluation seeds adds no test, nor one where only
    AdamW's arm has evaluated yet (the others still tuning: no rows at all), nor a check that is
    not a batch (b131072-fp32)."""
    from study.findings import family
    from study.results import write_csv

    def ledger(name, seeds_of):
        rows = [{"optimizer": arm, "model": "proxy-100k", "budget": 1.0, "seed": s, "role": "eval",
                 "chosen": 1, "final_val_loss": 1.5 + i / 10 + s / 1000,
                 "run_dir": f"runs/proxy-100k/1x/{arm}/eval/lr-0.01_seed-{s}"}
                for i, (arm, n) in enumerate(seeds_of.items()) for s in range(1, n + 1)]  # fmt: skip
        (tmp_path / name).mkdir()
        write_csv(rows, tmp_path / name / "results.csv")

    ledger("b2048", {"adamw": 5, "mars-adamw": 5, "mars-adamw:gamma=0": 5})
    ledger("b32768", {"adamw": 5, "mars-adamw": 3, "mars-adamw:gamma=0": 0})
    ledger("b8192", {"adamw": 5})
    ledger("b131072-fp32", {"adamw": 5, "mars-adamw": 5})
    assert list(family.crossover_losses(tmp_path)) == ["crossover b2048"]
    assert family.crossover_losses(None) == {}
