"""``python -m study rerun RUN_DIR ...``: does this checkout reproduce committed runs?

A study continued across commits mixes its rows' commits (the report names them). Whether a
later commit changed what a run computes is a question with a direct answer: run the same
command again here and compare. For each finished run directory (its ``meta.jsonl`` holds the
command, its ``summary.json`` the result) this reruns the command at the current checkout, into a
scratch folder (the run's own files are never touched), with the thread count of the original
(``--threads``, the study's ``OMP_NUM_THREADS``), and compares the final validation and training
losses to the last bit::

    python -m study rerun runs/referee/runs/proxy-100k/1x/adamw/eval/*_seed-1 --threads 1
    python -m study rerun results/referee/batch/results.csv:runs/proxy-100k/1x/adamw/eval/\
lr-0.008_aux_lr-0.512_wd-0.3162_beta2-0.95_warmup-0.4_seed-1

(a run directory, or a ledger's row ``LEDGER.csv:RUN_ID``: its recorded command, compared on the
final validation loss the ledger holds)

It prints one row per run (its commit, this one's, both losses, equal or the difference) and
exits 1 when any run differs, 2 on bad input. Equal losses after the whole run are what the
project calls bit for bit (every step's arithmetic in the same order); a difference of a few ulps
means the later code reorders some arithmetic, and the rows of the two commits are then not
interchangeable within one comparison. Bit for bit needs the same CPU kind as well: on another
(an AMD EPYC for a run made on an Intel Xeon) torch takes other vector kernels, the losses differ
in the last bits from the first step, and a long or unstable run amplifies that; each run records
its CPU (``cpu`` in meta.jsonl), and a difference on another kind says so. One model name is
not one kind: an "AMD EPYC" with AVX-512 and one without take other vector kernels, so runs also
record torch's kernel level (``cpu_capability``; the ledger's ``cpu`` reads ``AMD EPYC
(AVX512)``), a rerun takes the recorded level (``ATEN_CPU_CAPABILITY``), and
``--cpu-capability avx2`` reruns a run recorded without it at another level. ``--record FILE``
appends one JSON line per rerun as it finishes (results/crossover/checks/ keeps the study's).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from runtime import commands, runfiles

ROOT = Path(__file__).resolve().parent.parent
KEYS = ("final_val_loss", "final_train_loss")


def recorded(run_dir: Path) -> tuple[list[str], str, dict]:
    """The overrides (without out_dir), commit and summary of a finished run directory, or of
    a ledger's row (``LEDGER.csv:RUN_ID``: its final validation loss is the summary)."""
    from study import ledger

    if ledger.split_spec(str(run_dir)) is not None:
        row = ledger.ledger_row(str(run_dir))
        return (
            ledger.overrides_of(str(run_dir)),
            str(row.get("commit") or "?"),
            {"final_val_loss": row.get("final_val_loss")},
        )
    meta, summary = runfiles.read_meta(run_dir), runfiles.read_summary(run_dir)
    for name, got in ((runfiles.META, meta), (runfiles.SUMMARY, summary)):
        if not got:
            raise SystemExit(f"study.rerun: {run_dir} has no {name}: give finished run "
                             f"directories (they hold {runfiles.META} and {runfiles.SUMMARY})")  # fmt: skip
    first = meta[0]
    argv = first.get("argv") or []
    if not argv or not argv[0].endswith("train.py"):
        raise SystemExit(f"study.rerun: {run_dir / runfiles.META} does not record a train.py "
                         "command")  # fmt: skip
    if int(first.get("world_size") or 1) != 1:
        raise SystemExit(f"study.rerun: {run_dir} ran on {first['world_size']} processes; it "
                         "reruns one-process runs only (rerun that one under torchrun by hand)")  # fmt: skip
    overrides = [a for a in argv[1:] if not a.startswith("out_dir=")]
    return overrides, str(first.get("git_commit", "?")), summary


def recorded_cpu(run_dir: Path) -> str:
    """The CPU the run started on ("" for runs recorded before meta.jsonl named it)."""
    from study import ledger

    if ledger.split_spec(str(run_dir)) is not None:
        return str(ledger.ledger_row(str(run_dir)).get("cpu") or "")
    metas = runfiles.read_meta(run_dir)
    return str(metas[0].get("cpu") or "") if metas else ""


def head_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=ROOT, check=True)  # fmt: skip
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def compare(old: dict, new: dict) -> tuple[bool, str]:
    """Whether every key agrees exactly, and a short account of the differences."""
    diffs = []
    for k in [k for k in KEYS if k in old]:  # a ledger row holds the validation loss only
        a, b = old.get(k), new.get(k)
        if a != b:
            diffs.append(f"{k} {a!r} -> {b!r}" + (f" ({b - a:+.3g})" if None not in (a, b) else ""))
    return not diffs, "; ".join(diffs) or "equal"


def capability_of(cpu: str) -> str | None:
    """The vector-kernel level a recorded CPU names (``AMD EPYC (AVX512)``: ``AVX512``), or None
    for a CPU recorded without it."""
    m = re.fullmatch(r".*\(([A-Z0-9_]+)\)", cpu.strip())
    return m[1] if m else None


def rerun(run_dir: Path, scratch: Path, threads: int, capability: str | None = None) -> dict:
    """Rerun one run; ``capability``: torch's vector-kernel level to rerun at (ATEN_CPU_CAPABILITY;
    None: the run's recorded level, else this machine's own)."""
    overrides, commit, old = recorded(run_dir)
    out = scratch / Path(str(run_dir)).name
    cmd = commands.train_command([*overrides, f"out_dir={out}"])
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    was = recorded_cpu(run_dir)
    level = capability or capability_of(was)
    if level:
        env["ATEN_CPU_CAPABILITY"] = level.lower()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    new = runfiles.read_summary(out)
    if proc.returncode != 0 or new is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return {"run": str(run_dir), "commit": commit, "equal": False,
                "account": f"the rerun failed (exit {proc.returncode}): " + " | ".join(tail)}  # fmt: skip
    equal, account = compare(old, new)
    here = f"{runfiles.cpu_name()} ({level.upper() if level else runfiles.cpu_capability()})"
    if not equal and was != here:  # another CPU kind or kernel level: other vector kernels
        account += (f" (ran on {was or 'a CPU not recorded'}, rerun on {here}: another CPU kind "
                    "or vector-kernel level need not agree to the last bit"
                    + ("; --cpu-capability avx2 reruns at AVX2" if not capability_of(was) else "")
                    + ")")  # fmt: skip
    return {"run": str(run_dir), "commit": commit, "equal": equal, "account": account,
            "old": old.get("final_val_loss"), "val_loss": new.get("final_val_loss"), "cpu": was,
            "rerun_cpu": here, "threads": threads, "command": overrides}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m study rerun", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "runs", nargs="+", type=Path, help="finished run directories, or LEDGER.csv:RUN_ID"
    )
    ap.add_argument("--threads", type=int, default=1,
                    help="OMP_NUM_THREADS of each rerun (the study's --threads; default 1)")  # fmt: skip
    ap.add_argument("--keep", type=Path, default=None,
                    help="write the reruns here (default: a temporary folder, removed)")  # fmt: skip
    ap.add_argument("--cpu-capability", default=None, choices=["avx512", "avx2", "default"],
                    help="torch's vector-kernel level of the reruns (ATEN_CPU_CAPABILITY; "
                         "default: each run's recorded level, else this machine's)")  # fmt: skip
    ap.add_argument("--record", type=Path, default=None,
                    help="append one JSON line per rerun here (the commits, CPUs, losses)")  # fmt: skip
    args = ap.parse_args(argv)
    try:
        for r in args.runs:
            recorded(r)  # every input checked before the first (slow) run
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    head = head_commit()
    print(f"rerunning {len(args.runs)} run(s) at {head[:7]} with {args.threads} thread(s) on "
          f"{runfiles.cpu_name()}")  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory(prefix="study-rerun-") as tmp:
        scratch = args.keep or Path(tmp)
        if args.keep and args.keep.is_dir() and any(args.keep.iterdir()):
            print(f"study.rerun: --keep {args.keep} is not empty: give a new folder",
                  file=sys.stderr)  # fmt: skip
            return 2
        scratch.mkdir(parents=True, exist_ok=True)
        for r in args.runs:
            row = rerun(r, scratch, args.threads, args.cpu_capability)
            rows.append(row)
            if args.record is not None:  # as it is taken: a later run's failure keeps it
                with open(args.record, "a") as f:
                    f.write(json.dumps({"head": head, **row}) + "\n")
            print(f"{row['commit'][:7]} -> {head[:7]}  {'EQUAL' if row['equal'] else 'DIFFERS'}  "
                  f"{row['account']}  {row['run']}", flush=True)  # fmt: skip
    n = sum(r["equal"] for r in rows)
    print(f"{n} of {len(rows)} reproduced bit for bit at {head[:7]}")
    return 0 if n == len(rows) else 1
