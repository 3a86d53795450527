"""The one door to a run directory: the names of its files, and how each is written and read.

A run directory (train.py's ``out_dir``) holds:

- ``config.yaml``: the resolved config, written once by rank 0 (a continuation must match it);
- ``meta.jsonl``: one line per session (when, where, which code: ``git_commit``, ``host``, ...),
  and lines that add to it once known (``add_to_session``: the optimizer's routes after the first
  step), marked ``same_session``: ``read_meta`` folds them into their session's record;
- ``metrics.jsonl``: one record per logged step or evaluation (``step``, ``train_loss``,
  ``val_loss``, ``tokens``, ...), cut back to the checkpoint's step when a run resumes;
- ``summary.json``: the run's summary (``steps``, ``final_val_loss``, ``best_val_loss``,
  ``elapsed_s``, ...), written when a session ends, or when a run stops for divergence
  (``stopped: diverged``: never finished, with no final loss);
- ``git.diff``: the uncommitted code of the session that started the run from step 0 (only where
  its tree was not clean); a resumed session with an unclean tree writes its own,
  ``git.N.diff`` (``session_diff``), and its meta line names it (``git_diff``);
- ``checkpoints/`` (trainer/checkpoint.py) and ``eval/`` (eval.py's results).

The trainer writes them; the study, the report and the launchers read them here, so a file's name
and format live in one place. The readers are tolerant: a missing or unreadable file is ``None``
(or no records), and a line cut short by a killed process is skipped. Depends on the standard
library and yaml only, so every part may import it.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import yaml

from runtime.files import atomic_open

CONFIG = "config.yaml"
META = "meta.jsonl"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
GIT_DIFF = "git.diff"
SESSION_DIFFS = "git.*.diff"  # a resumed session's own diff: session_diff
CHECKPOINTS = "checkpoints"
EVAL = "eval"
DIVERGED = "diverged"  # summary.json's ``stopped`` of a run stopped by non-finite steps


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``; else what ``platform`` knows). Runs record it:
    the same command on another CPU kind (an AMD EPYC against an Intel Xeon, say) takes other
    vector kernels and differs in the last bits, which a long or unstable run amplifies."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_capability() -> str:
    """torch's vector-kernel level on this CPU (``AVX512``, ``AVX2``, ``DEFAULT``; the variable
    ``ATEN_CPU_CAPABILITY`` lowers it). Runs record it beside ``cpu_name``: two machines of one
    model name (an "AMD EPYC" with AVX-512 and one without) take other kernels and differ in
    the last bits from the first steps (docs/study.md, "Provenance")."""
    import torch

    return str(torch.backends.cpu.get_cpu_capability())


def session_diff(session: int) -> str:
    """The name of the ``session``-th session's diff (1: the run's start, ``git.diff``): each
    session's uncommitted code stays beside the others', rather than a resume's replacing it."""
    return GIT_DIFF if session <= 1 else f"git.{session}.diff"


def is_run_dir(path: Path) -> bool:
    """``path`` holds a run: its config and its metrics log."""
    return (path / CONFIG).is_file() and (path / METRICS).is_file()


# --- writing (the trainer, rank 0) ---------------------------------------------------------------


def write_config(run_dir: Path, config: dict[str, Any]) -> None:
    """``config.yaml``, atomically: a kill never leaves half a config."""
    with atomic_open(run_dir / CONFIG, "w") as f:
        f.write(yaml.safe_dump(config, sort_keys=False))


def append_meta(run_dir: Path, meta: dict[str, Any]) -> None:
    """One more line of ``meta.jsonl`` (a session: a start or a restart), whole or not at all:
    a failed write (a full disk) cuts the file back and raises OSError naming it."""
    path = run_dir / META
    with open(path, "ab", buffering=0) as f:  # unbuffered: no second failure on close
        start, data = f.tell(), memoryview((json.dumps(meta) + "\n").encode("utf-8"))
        try:
            while data:
                data = data[f.write(data) :]
        except OSError as exc:
            with contextlib.suppress(OSError):  # never leave half a line behind
                f.truncate(start)
            raise OSError(exc.errno, f"could not write {path}: {exc.strerror or exc}") from None


SAME_SESSION = "same_session"  # a meta.jsonl line that adds to the session line before it


def add_to_session(run_dir: Path, fields: dict[str, Any]) -> None:
    """``fields`` added to the current session's record of ``meta.jsonl`` (one more line, marked
    ``same_session``; ``read_meta`` merges it), written as ``append_meta`` writes."""
    append_meta(run_dir, {SAME_SESSION: True, **fields})


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """``summary.json``, atomically."""
    with atomic_open(run_dir / SUMMARY, "w") as f:
        f.write(json.dumps(summary, indent=2) + "\n")


# --- reading (everyone) --------------------------------------------------------------------------


def load_config(run_dir: Path) -> Any:
    """``config.yaml`` as YAML loads it; raises OSError or yaml.YAMLError (for a reader that
    reports why, as the report does). Most readers want ``read_config``."""
    return yaml.safe_load((run_dir / CONFIG).read_text(encoding="utf-8"))


def read_config(run_dir: Path) -> dict[str, Any] | None:
    """The run's config; None when it is missing, unreadable or not a mapping."""
    try:
        config = load_config(run_dir)
    except (OSError, yaml.YAMLError):
        return None
    return config if isinstance(config, dict) else None


def read_summary(run_dir: Path, warnings: list[str] | None = None) -> dict[str, Any] | None:
    """The run's summary; None when there is none yet, or it is unreadable or not a JSON object
    (then said in ``warnings``, when given)."""
    path = run_dir / SUMMARY
    if not path.is_file():
        return None
    return read_json(path, warnings)


def read_json(path: Path, warnings: list[str] | None = None) -> dict[str, Any] | None:
    """The JSON object in ``path`` (a summary, an evaluation's results); None when it is
    unreadable or not an object (said in ``warnings``, when given)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        _warn(warnings, f"{path}: unreadable ({exc}); ignored")
        return None
    if not isinstance(data, dict):
        _warn(warnings, f"{path}: not a JSON object; ignored")
        return None
    return data


def _warn(warnings: list[str] | None, message: str) -> None:
    if warnings is not None:
        warnings.append(message)


def read_jsonl(path: Path, warnings: list[str] | None = None) -> list[dict[str, Any]]:
    """The JSON objects of a ``.jsonl`` file (none when it is missing). A line that is not JSON is
    skipped: the last one silently (a run being written, or killed mid-line), any other with a
    warning."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    lines = [ln for ln in text.splitlines() if ln]
    records = []
    for i, line in enumerate(lines):
        try:
            record = json.loads(line)
        except ValueError:
            if i < len(lines) - 1:
                _warn(warnings, f"{path}: line {i + 1} is not JSON; skipped")
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def read_metrics(run_dir: Path, warnings: list[str] | None = None) -> list[dict[str, Any]]:
    """The records of ``metrics.jsonl`` that have a step, in the order they were logged."""
    return [r for r in read_jsonl(run_dir / METRICS, warnings) if "step" in r]


def read_meta(run_dir: Path) -> list[dict[str, Any]]:
    """The sessions of ``meta.jsonl``, first to last: one record each, the lines that add to a
    session (``add_to_session``) merged into it."""
    sessions: list[dict[str, Any]] = []
    for record in read_jsonl(run_dir / META):
        if record.pop(SAME_SESSION, False) and sessions:
            sessions[-1].update(record)
        else:
            sessions.append(record)
    return sessions


def finished(run_dir: Path, max_steps: int | None = None) -> dict[str, Any] | None:
    """The summary of a run that is over: finished (``reached``), or stopped for divergence
    (``diverged``: its ``final_val_loss`` is None, so a study counts it as diverged rather than
    running it again); else None. ``max_steps`` by default the run's config's."""
    summary = read_summary(run_dir)
    if summary is not None and max_steps is None:
        max_steps = (read_config(run_dir) or {}).get("max_steps")
    return summary if reached(summary, max_steps) or diverged(summary) else None


def diverged(summary: dict[str, Any] | None) -> bool:
    """Whether a run with this summary stopped for divergence (never finished: ``reached`` is
    False for it however many steps it took)."""
    return (summary or {}).get("stopped") == DIVERGED


def reached(summary: dict[str, Any] | None, max_steps: int | float | None) -> bool:
    """Whether a run with this summary is finished: its ``steps`` are at least ``max_steps``. A
    summary is written only when a session completes its steps, so with ``max_steps`` unknown
    (None) any summary that records its steps counts."""
    steps = (summary or {}).get("steps")
    if diverged(summary) or not isinstance(steps, int | float) or isinstance(steps, bool):
        return False
    return max_steps is None or steps >= max_steps
