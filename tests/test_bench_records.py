"""Every GPU figure a record: the tables of README's "Speed and memory" and docs/gpu-figures.md
are made from committed records (bench/tables.py's mark) or marked as from an earlier run with
no record; README's GPU-test sentence is the newest gpu-tests record's; every committed record
renders (bench.tables)."""

import re
from pathlib import Path

import pytest

from bench import tables

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "bench" / "records"
NO_RECORD = "from an earlier run, no record"


def speed_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Speed and memory")
    return text[start : text.index("\n## ", start + 1)]


def tables_in(text: str) -> list[tuple[int, str]]:
    """(line number, first line) of each Markdown table of ``text``."""
    lines, out = text.splitlines(), []
    for i, line in enumerate(lines):
        if line.startswith("|") and (i == 0 or not lines[i - 1].startswith("|")):
            out.append((i, line))
    return out


def backed(text: str, at: int) -> bool:
    """Whether the table at line ``at`` follows a generated mark, or lies in a section (up to
    its nearest heading) that says it is from an earlier run with no record."""
    lines = text.splitlines()
    if at and tables.MARKER.match(lines[at - 1] + "\n"):
        return True
    i = at - 1
    while i >= 0 and not lines[i].startswith("#"):
        i -= 1
    above = lines[max(i, 0) : at]
    heads = [h for h in lines[:at] if h.startswith("## ")]  # the section's top heading too
    said = [x.lower() for x in above] + [h.lower() for h in heads[-1:]]
    return any(NO_RECORD in x for x in said)


@pytest.mark.parametrize("doc", ["README.md", "docs/gpu-figures.md"])
def test_every_gpu_table_is_generated_or_marked(doc):
    text = speed_section() if doc == "README.md" else (ROOT / doc).read_text()
    loose = [f"{doc}:{n + 1}: {first[:60]}" for n, first in tables_in(text) if not backed(text, n)]
    assert loose == []
    assert tables.MARKER.search(text), f"{doc}: no generated figure"


def test_readme_generated_figures_are_their_records():
    assert tables.stale(ROOT / "README.md") == []


def test_readme_gpu_test_sentence_is_the_newest_record():
    newest = sorted(RECORDS.glob("gpu-tests-*.jsonl"))[-1]
    marks = [m.group(1) for m in tables.MARKER.finditer(speed_section())]
    assert str(newest.relative_to(ROOT)) in marks
    said = tables.table(str(newest.relative_to(ROOT)))
    assert said in speed_section()
    assert "41 passed, 9 failed, 1 skipped" in tables.table(
        "bench/records/gpu-tests-20261128.jsonl"
    )


def test_no_claim_that_every_gpu_test_passes():
    readme = (ROOT / "README.md").read_text()
    assert "every GPU test passes" not in readme


def test_every_committed_record_renders():
    for path in sorted(RECORDS.glob("*.json")) + sorted(RECORDS.glob("gpu-tests-*.jsonl")):
        rel = str(path.relative_to(ROOT))
        made = tables.table(rel)
        assert made.strip(), rel


def test_a_glob_of_records_is_one_table_with_the_spread(tmp_path, monkeypatch):
    import json

    monkeypatch.setattr(tables, "ROOT", tmp_path)
    facts = {"gpu": "GPU X", "driver": "1", "cuda": "13.0", "torch": "2.x", "triton": "3.y",
             "cpu": "c"}  # fmt: skip
    for i, tok in enumerate([100.0, 300.0, 200.0]):
        rec = {"kind": "train", "facts": facts, "commit": "abcdef123", "dirty": False,
               "time_utc": "2026-12-08T00:00:00Z", "model": "m", "optimizer": "adamw",
               "routing": None, "micro_batch": 2, "seq_len": 8, "accum": 4, "dtype": "bf16",
               "tf32": True, "compile": True, "tok_s": tok, "mfu": tok / 1000,
               "peak_bytes": 2**30, "estimate_bytes": 2**30, "first_step_s": 1.0}  # fmt: skip
        (tmp_path / f"train-{i}.json").write_text(json.dumps(rec))
    made = tables.table("train-*.json")
    assert "| 200 (100-300) | 20.0 (10.0-30.0)% |" in made
    assert "GPU X, driver 1, CUDA 13.0" in made and "3 records" in made
    assert re.search(r"\| 3 \|\n", made)


def test_a_table_typed_without_a_record_is_found():
    text = "## Speed\n\nsome words\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
    ((n, _),) = tables_in(text)
    assert not backed(text, n)
    assert backed(text.replace("some words", f"Typed: {NO_RECORD}."), n)
    mark = "<!-- generated: python -m bench.tables x.json -->"
    marked = text.replace("some words\n\n", f"some words\n\n{mark}\n")
    assert backed(marked, tables_in(marked)[0][0])
