"""Docs tables made from benchmark records (bench/record.py), not typed by hand.

    python -m bench.tables bench/records/optim_host-20261127T224856Z.json

prints the Markdown table of a record (``bench.optim_host``: host ms a step per variant, median
and the spread of the rounds; ``bench.collectives``: the Newton-Schulz collectives per world
size). In docs, a table made so follows the line
``<!-- generated: python -m bench.tables PATH -->``; tests/test_bench_tables.py checks that
every such table is what its record makes.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"<!-- generated: python -m bench\.tables (\S+) -->\n")
HOST_LABELS = {
    "torch-adamw-fused": "torch AdamW fused + `clip_grad_norm_`",
    "torch-adamw-foreach": "torch AdamW foreach + `clip_grad_norm_`",
    "mars-adamw": "MARS-AdamW engine, launch list kept",
    "mars-adamw-unkept": "MARS-AdamW engine, built every step (before)",
    "lion": "Lion engine, kept",
    "muon": "Muon engine, kept (Newton-Schulz stubbed)",
}


def optim_host(rec: dict) -> str:
    """bench.optim_host's record: a row per variant."""
    rows = ["| variant (the trainer's clip included) | host ms a step, median (min-max) | "
            "engine launches |", "|---|---|---|"]  # fmt: skip
    for name, s in rec["summary"].items():
        launches = "-" if name.startswith("torch-") else f"{rec['launches_per_step'][name]:.0f}"
        rows.append(f"| {HOST_LABELS.get(name, name)} | {s['median']:.2f} "
                    f"({s['min']:.2f}-{s['max']:.2f}) | {launches} |")  # fmt: skip
    return "\n".join(rows) + "\n"


def collectives(rec: dict) -> str:
    """bench.collectives's record: a row per world size."""
    rows = ["| ranks | NS GFLOP a rank, max / mean | DDP all-gathers a step, per shape (merged): "
            "MB received a rank | FSDP2 all-to-alls: MB there / back at most |",
            "|---|---|---|---|"]  # fmt: skip
    for world, f in rec["per_world"].items():
        ddp, merged, fsdp = f["ddp_per_shape"], f["ddp_merged"], f["fsdp"]
        rows.append(f"| {world} | {f['ns_gflop_max']:.0f} / {f['ns_gflop_mean']:.0f} | "
                    f"{ddp['all_gathers']}: {ddp['received_mb']:.0f} ({merged['all_gathers']}: "
                    f"{merged['received_mb']:.0f}) | {fsdp['all_to_alls']}: "
                    f"{fsdp['there_mb']:.1f} / {fsdp['back_mb_most']:.1f} |")  # fmt: skip
    return "\n".join(rows) + "\n"


MAKERS = {"bench.optim_host": optim_host, "bench.collectives": collectives}


def table(path: str | Path) -> str:
    """The table of the record at ``path`` (relative to the repository's root)."""
    rec = json.loads((ROOT / path).read_text())
    module = rec["command"][2] if rec["command"][:2] == ["python", "-m"] else None
    if module not in MAKERS:
        raise SystemExit(f"{path}: a record of {module!r}; tables are made for {sorted(MAKERS)}")
    return MAKERS[module](rec)


def stale(doc: Path) -> list[str]:
    """The generated tables of ``doc`` that differ from what their records make."""
    text, out = doc.read_text(), []
    for m in MARKER.finditer(text):
        want = table(m.group(1))
        if text[m.end() : m.end() + len(want)] != want:
            out.append(f"{doc.name}: the table after {m.group(0).strip()} is not its record's")
    return out


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m bench.tables bench/records/RECORD.json")
    sys.stdout.write(table(sys.argv[1]))


if __name__ == "__main__":
    main()
