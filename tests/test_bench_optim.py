"""bench.optim's --set: an option reaches the optimizers that have it, and only those."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _bench(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "bench.optim", "--model", "proxy-100k", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_set_reaches_the_optimizers_that_have_the_option() -> None:
    proc = _bench("--only", "adamw", "muon", "--set", "ns_dtype=float32", "--steps", "1",
                  "--warmup", "0")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()[3:]}
    assert "ns_dtype=float32" in rows["muon"] and "ns_dtype" not in rows["adamw"]


def test_set_without_a_value_is_refused_in_one_line() -> None:
    proc = _bench("--only", "adamw", "--set", "ns_dtype")
    assert proc.returncode != 0
    assert "write KEY=VALUE, e.g. ns_dtype=float32" in proc.stderr.strip().splitlines()[-1]
