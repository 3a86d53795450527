"""Each published part's README is study.part_readme's rendering of its ledger, its definition's
question and the one family (it cannot be typed by hand or go stale)."""

import pytest

from helpers import ROOT
from study import part_readme


@pytest.fixture(scope="module")
def tests():
    return part_readme._family(ROOT)


@pytest.mark.parametrize("study", part_readme.STUDIES)
def test_every_published_parts_readme_is_rendered_from_its_files(study, tests):
    parts = part_readme.parts_of(study)
    assert parts, f"{study}: no published part"
    for part in parts:
        path = ROOT / part.results / "README.md"
        assert path.is_file(), f"{path}: missing; run python -m study readmes"
        assert path.read_text() == part_readme.render(study, part, tests), (
            f"{path}: stale; run python -m study readmes"
        )


def test_a_fixture_part_gives_its_cells_and_claims(tmp_path):
    from study import definition as defs
    from study.results import write_csv

    part = defs.Part("referee", "headline", {"description": "Which is best?"}, runs=tmp_path,
                     results=tmp_path / "p")  # fmt: skip
    (tmp_path / "p").mkdir()
    rows = [{"optimizer": o, "model": "proxy-100k", "budget": 1.0, "batch_tokens": 2048.0,
             "seed": s, "role": "eval", "chosen": 1, "lr": 0.008, "final_val_loss": v + s / 100,
             "collapsed": 0, "commit": "abc"}
            for o, v in (("adamw", 1.5), ("muon", 1.3)) for s in (1, 2, 3)]  # fmt: skip
    write_csv(rows, tmp_path / "p" / "results.csv")
    claim = {"test": "headline: proxy-100k 1x: muon - adamw", "mean": -0.2, "lo": -0.21,
             "hi": -0.19, "p": 1e-4, "holm_p": 0.004}  # fmt: skip
    other = {**claim, "test": "ladder: proxy-100k 0.25x: muon - adamw"}
    text = part_readme.render("referee", part, [claim, other], root=tmp_path.parent)
    assert "Which is best?" in text
    assert "| proxy-100k | 1x | 2,048 | adamw | 0.008 | 3 | 1.5200 (0.0100) | 0 |" in text
    assert (
        "| headline: proxy-100k 1x: muon - adamw | -0.2000 [-0.2100, -0.1900] | 0.004 | yes |"
        in text
    )
    assert "ladder:" not in text and "- `abc`: 6 runs" in text


def test_every_table_kind_a_definition_may_name_has_its_writer():
    from study import definition as defs
    from study.parts import TABLE_WRITERS

    assert set(defs.TABLES) == set(TABLE_WRITERS)
    for study in part_readme.STUDIES:
        assert set(defs.load(study).tables) <= set(TABLE_WRITERS)
