"""Docs tables made from benchmark records (bench/tables.py): every table that follows a
``<!-- generated: python -m bench.tables PATH -->`` line is what its record makes."""

from pathlib import Path

import pytest

from bench import tables

DOCS = sorted((Path(__file__).resolve().parent.parent / "docs").glob("*.md"))


def test_every_generated_table_is_its_records():
    marked = [d for d in DOCS if tables.MARKER.search(d.read_text())]
    assert {d.name for d in marked} >= {"optim-engine.md", "newton-schulz.md"}
    assert [line for d in marked for line in tables.stale(d)] == []


def test_a_table_typed_over_is_found(tmp_path):
    rec = "bench/records/collectives-gpt2-small.json"
    made = tables.table(rec)
    doc = tmp_path / "x.md"
    doc.write_text(f"<!-- generated: python -m bench.tables {rec} -->\n{made}")
    assert tables.stale(doc) == []
    doc.write_text(
        f"<!-- generated: python -m bench.tables {rec} -->\n{made.replace('199', '198')}"
    )
    assert len(tables.stale(doc)) == 1


def test_a_record_of_another_benchmark_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(tables, "ROOT", tmp_path)
    (tmp_path / "r.json").write_text('{"command": ["python", "-m", "bench.train"]}')
    with pytest.raises(SystemExit, match="tables are made for"):
        tables.table("r.json")


def test_rewrite_puts_each_records_table_back(tmp_path):
    rec = "bench/records/collectives-gpt2-small.json"
    made = tables.table(rec)
    doc = tmp_path / "x.md"
    typed = made.replace("199", "198")
    doc.write_text(f"before\n\n<!-- generated: python -m bench.tables {rec} -->\n{typed}\nafter\n")
    assert tables.rewrite(doc) == 1 and tables.stale(doc) == []
    assert doc.read_text().endswith(f"{made}\nafter\n") and tables.rewrite(doc) == 0


def test_an_older_collectives_record_and_a_missing_doc_are_one_line(tmp_path, monkeypatch):
    import json
    import sys

    rec = json.loads((tables.ROOT / "bench/records/collectives-gpt2-small.json").read_text())
    for f in rec["per_world"].values():
        del f["fsdp"]["buffer_mb"]
    with pytest.raises(SystemExit, match="older bench.collectives.*rerun it"):
        tables.collectives(rec)
    monkeypatch.setattr(sys, "argv", ["bench.tables", "--docs", str(tmp_path / "none.md")])
    with pytest.raises(SystemExit, match="no such Markdown file"):
        tables.main()
