"""Docs tables made from benchmark records (bench/record.py), not typed by hand.

    python -m bench.tables bench/records/optim_host-20261127T224856Z.json

prints the Markdown table of a record (``bench.optim_host``: host ms a step per variant, median
and the spread of the rounds; ``bench.collectives``: the Newton-Schulz collectives per world
size; the records of bench/record.py ``measurement`` by their ``kind``: ``train`` (bench.train),
``optim-step`` (bench.optim_fused), ``occupancy`` (bench.occupancy); a ``gpu-tests`` JSON-lines
record (``pytest -m gpu``'s outcomes): the sentence that says them). ``PATH`` may be a glob
(``bench/records/gpu-20261208/train-*.json``): one table of every record it matches, which must
be of one kind. In docs and README.md, a table made so follows the line
``<!-- generated: python -m bench.tables PATH -->``; tests/test_bench_tables.py and
tests/test_bench_records.py check that every such table is what its records make.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections import Counter
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
    """bench.collectives's record: a row per world size. A record of an older bench.collectives
    (without the broadcasts' or the FSDP2 buffers' figures) is refused in one line: rerun it."""
    first = next(iter(rec["per_world"].values()))
    if "results_mb" not in first["ddp_merged"] or "buffer_mb" not in first["fsdp"]:
        raise SystemExit(
            "a record of an older bench.collectives (no broadcast or FSDP2 buffer "
            f"figures): rerun it, {' '.join(rec.get('command', []))}"
        )
    rows = ["| ranks | NS GFLOP a rank, max / mean (bound) | DDP a step, merged: all-gathers + "
            "broadcasts | MB received a rank at most / results (padded all-gather) | "
            "NS buffers MB a rank (padded) | FSDP2 all-to-alls: MB there / back at most "
            "(buffers MB) |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    for world, f in rec["per_world"].items():
        m, fsdp = f["ddp_merged"], f["fsdp"]
        rows.append(f"| {world} | {f['ns_gflop_max']:.0f} / {f['ns_gflop_mean']:.0f} "
                    f"({f['ns_gflop_bound']:.0f}) | {m['all_gathers']} + {m['broadcasts']} | "
                    f"{m['received_mb']:.0f} / {m['results_mb']:.0f} "
                    f"({m['padded_received_mb']:.0f}) | {m['buffer_mb']:.0f} "
                    f"({m['padded_buffer_mb']:.0f}) | {fsdp['all_to_alls']}: "
                    f"{fsdp['there_mb']:.1f} / {fsdp['back_mb_most']:.1f} "
                    f"({fsdp['buffer_mb']:.0f}) |")  # fmt: skip
    return "\n".join(rows) + "\n"


MAKERS = {"bench.optim_host": optim_host, "bench.collectives": collectives}


def _spread(values: list[float], fmt: str) -> str:
    """``median (min-max)`` of ``values``; the value alone where there is one."""
    if len(values) == 1:
        return format(values[0], fmt)
    lo, mid, hi = min(values), statistics.median(values), max(values)
    return f"{mid:{fmt}} ({lo:{fmt}}-{hi:{fmt}})"


def _device(recs: list[dict]) -> str:
    """The device line under a table: GPU (or CPU), driver, CUDA, torch, Triton, commit(s)."""
    f = recs[0]["facts"]
    commits = sorted({(r.get("commit") or "?")[:8] + ("+dirty" if r.get("dirty") else "")
                      for r in recs})  # fmt: skip
    days = sorted({r["time_utc"][:10] for r in recs})
    what = f["gpu"] or f"CPU {f.get('cpu')}"
    return (f"{what}, driver {f.get('driver') or '-'}, CUDA {f.get('cuda') or '-'}, torch "
            f"{f['torch']}, Triton {f.get('triton') or '-'}; commit {', '.join(commits)}; "
            f"{', '.join(days)}; {len(recs)} record{'s' if len(recs) > 1 else ''}")  # fmt: skip


def train(recs: list[dict]) -> str:
    """bench.train's records: a row per case (model, optimizer, batch, arithmetic), its
    processes' best tokens/s as median (min-max) over the processes."""
    rows = ["| model | optimizer | micro-batch x tokens x accumulation | dtype, TF32, compile | "
            "tokens/s, median (min-max) over processes | MFU | peak GiB (estimate) | "
            "first step s | processes |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    cases: dict[tuple, list[dict]] = {}
    for r in recs:
        opt = r["optimizer"] + (f" ({r['routing']})" if r.get("routing") else "")
        shape = f"{r['micro_batch']} x {r['seq_len']} x {r['accum']}"
        arith = f"{r['dtype']}, {'-' if r['tf32'] is None else r['tf32']}, {r['compile']}"
        cases.setdefault((r["model"], opt, shape, arith), []).append(r)
    for (model, opt, shape, arith), rs in cases.items():
        done = [r for r in rs if r.get("tok_s")]
        if not done:
            rows.append(f"| {model} | {opt} | {shape} | {arith} | out of memory | - | - | - | "
                        f"{len(rs)} |")  # fmt: skip
            continue
        mfu = [100 * r["mfu"] for r in done if r.get("mfu") is not None]
        peak = max(r["peak_bytes"] for r in done) / 2**30
        est = done[0].get("estimate_bytes")
        first = [r["first_step_s"] for r in done if r.get("first_step_s") is not None]
        rows.append(f"| {model} | {opt} | {shape} | {arith} | "
                    f"{_spread([r['tok_s'] for r in done], ',.0f')} | "
                    f"{_spread(mfu, '.1f') + '%' if mfu else '-'} | {peak:.2f} "
                    f"({'-' if est is None else f'{est / 2**30:.2f}'}) | "
                    f"{_spread(first, '.1f') if first else '-'} | {len(done)} |")  # fmt: skip
    return "\n".join(rows) + "\n\n" + _device(recs) + "\n"


def optim_step(recs: list[dict]) -> str:
    """bench.optim_fused's records: a row per variant and block size, wall ms a step (median
    over its rounds, then median (min-max) over the records), the profiler's kernel time, the
    bytes the step moves and their share of the device's copy bandwidth."""
    rows = ["| variant | block, warps | wall ms a step | kernel ms a step (profiler) | kernels | "
            "MB moved | GB/s (wall) | % of copy bandwidth | records |",
            "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    cases: dict[tuple, list[dict]] = {}
    for r in recs:
        block = f"{r['block']}, {r['warps']}" if r.get("block") else "-"
        cases.setdefault((r["variant"], block), []).append(r)
    for (variant, block), rs in cases.items():
        wall = [r["spread"]["median"] for r in rs]
        kern = [r["kernel_ms"] for r in rs if r.get("kernel_ms") is not None]
        moved, mid = rs[0].get("bytes_moved") or 0, statistics.median(wall)
        copy = [r["copy_gbs"] for r in rs if r.get("copy_gbs")]
        gbs = moved / (mid / 1e3) / 1e9 if moved else None
        share = f"{100 * gbs / statistics.median(copy):.0f}%" if gbs and copy else "-"
        kernels = rs[0].get("kernels")
        rows.append(f"| {variant} | {block} | {_spread(wall, '.2f')} | "
                    f"{_spread(kern, '.2f') if kern else '-'} | "
                    f"{'-' if kernels is None else kernels} | "
                    f"{f'{moved / 1e6:.0f}' if moved else '-'} | "
                    f"{f'{gbs:.0f}' if gbs else '-'} | {share} | {len(rs)} |")  # fmt: skip
    return "\n".join(rows) + "\n\n" + _device(recs) + "\n"


def occupancy(recs: list[dict]) -> str:
    """bench.occupancy's record: a row per candidate block size of the update kernel."""
    rows = ["| kernel variant | block | warps | registers a thread | CTAs per SM (registers) | "
            "warps per SM |", "|---|---|---|---|---|---|"]  # fmt: skip
    for r in recs:
        for c in r["candidates"]:
            rows.append(f"| {c['variant']} | {c['block']} | {c['warps']} | {c['registers']} | "
                        f"{c['ctas_per_sm']} | {c['ctas_per_sm'] * c['warps']} |")  # fmt: skip
    f = recs[0]
    return ("\n".join(rows) + f"\n\n{f['target']} compiled on a CPU by Triton "
            f"{f['facts'].get('triton')}; commit {(f.get('commit') or '?')[:8]}"
            f"{'+dirty' if f.get('dirty') else ''}; {f['time_utc'][:10]}\n")  # fmt: skip


KINDS = {"train": train, "optim-step": optim_step, "occupancy": occupancy}


def gpu_tests(lines: list[dict]) -> str:
    """A ``pytest -m gpu`` record (JSON lines: ``device``, ``gpu-tests`` and one ``test`` line a
    test and call): the first call's outcomes in a sentence, and what a later call changed."""
    dev = next(r for r in lines if r["event"] == "device")
    tests = [r for r in lines if r["event"] == "test"]
    first = Counter(r["outcome"] for r in tests if r.get("call", 1) == 1)
    day = next((m.group(0) for r in lines if r["event"] == "about"
                for m in [re.search(r"\d{4}-\d{2}-\d{2}", r["what"])] if m), "?")  # fmt: skip
    said = ", ".join(f"{first[k]} {k}" for k in ("passed", "failed", "skipped") if first[k])
    out = (f"`pytest -m gpu` on one {dev['gpu']} (torch {dev['torch']}, Triton "
           f"{dev['triton']}), {day}, commit {dev['commit']}: {said}")  # fmt: skip
    later = [r for r in tests if r.get("call", 1) > 1]
    if later:
        still = sorted(r["test"].split("::")[-1] for r in later if r["outcome"] == "failed")
        fixed = sum(1 for r in later if r["outcome"] == "passed" and any(
            t["test"] == r["test"] and t["outcome"] == "failed" and t.get("call", 1) == 1
            for t in tests))  # fmt: skip
        out += f"; of the failures, {fixed} passed with their fixes in a second call" + (
            f" and {len(still)} failed again (`{'`, `'.join(still)}`)" if still else ""
        )
    return out + ".\n"


def _records(path: str) -> list[dict]:
    """The records ``path`` names (a file or a glob, relative to the repository's root)."""
    files = sorted(ROOT.glob(path)) if any(c in path for c in "*?[") else [ROOT / path]
    if not files:
        raise SystemExit(f"{path}: no record matches")
    return [json.loads(f.read_text()) for f in files]


def table(path: str | Path) -> str:
    """The table of the record(s) at ``path`` (relative to the repository's root)."""
    path = str(path)
    if path.endswith(".jsonl"):
        return gpu_tests([json.loads(x) for x in (ROOT / path).read_text().splitlines() if x])
    recs = _records(path)
    kinds = {r.get("kind") for r in recs}
    if kinds <= set(KINDS) and len(kinds) == 1:
        return KINDS[kinds.pop()](recs)
    rec = recs[0]
    module = rec["command"][2] if rec["command"][:2] == ["python", "-m"] else None
    if len(recs) > 1 or module not in MAKERS:
        raise SystemExit(
            f"{path}: a record of {module!r} (kind {sorted(map(str, kinds))}); "
            f"tables are made for {sorted(MAKERS)} and kinds {sorted(KINDS)}"
        )
    return MAKERS[module](rec)


def stale(doc: Path) -> list[str]:
    """The generated tables of ``doc`` that differ from what their records make."""
    text, out = doc.read_text(), []
    for m in MARKER.finditer(text):
        want = table(m.group(1))
        if text[m.end() : m.end() + len(want)] != want:
            out.append(f"{doc.name}: the table after {m.group(0).strip()} is not its record's")
    return out


def rewrite(doc: Path) -> int:
    """Each generated table of ``doc`` replaced by what its record makes (the old one: as many
    blank-line-separated paragraphs after the marker as the new one has); how many changed."""
    text, changed, at, out = doc.read_text(), 0, 0, []
    for m in MARKER.finditer(text):
        want, end = table(m.group(1)), m.end()
        for _ in range(want.rstrip("\n").count("\n\n") + 1):
            end = text.find("\n\n", end) + 1 or len(text)
        changed += text[m.end() : end] != want
        out += [text[at : m.end()], want]
        at = end
    if changed:
        doc.write_text("".join(out) + text[at:])
    return changed


def main() -> None:
    if sys.argv[1:2] == ["--docs"] and len(sys.argv) > 2:
        for doc in sys.argv[2:]:
            if not Path(doc).is_file():
                raise SystemExit(f"{doc}: no such Markdown file")
            print(f"{doc}: {rewrite(Path(doc))} table(s) rewritten from their records")
        return
    if len(sys.argv) != 2:
        raise SystemExit(
            "usage: python -m bench.tables bench/records/RECORD.json\n"
            "       python -m bench.tables --docs DOC.md ...  (rewrite its tables)"
        )
    sys.stdout.write(table(sys.argv[1]))


if __name__ == "__main__":
    main()
