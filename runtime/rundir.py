"""The run directory: its name, its config (never silently replaced), and run metadata."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import yaml

from data.shards import atomic_open
from runtime.config import config_differences

CONFIG_FILE = "config.yaml"


def default_out_dir() -> str:
    return os.path.join("runs", datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S"))


def check_run_dir(out_dir: Path, config: dict, resuming: bool) -> None:
    """Refuse to write into a directory that holds another run.

    The directory may hold a run with the same config (it is then continued), or nothing of a
    run. A different config, or an existing run with resume=never, is an error that names the
    differences and the way out.
    """
    cfg_path = out_dir / CONFIG_FILE
    if not cfg_path.exists():
        leftovers = [
            p.name for p in (out_dir / "metrics.jsonl", out_dir / "checkpoints") if p.exists()
        ]
        if leftovers:
            raise SystemExit(
                f"{out_dir} holds run files ({', '.join(leftovers)}) but no {CONFIG_FILE}; "
                "choose another out_dir or move those files away"
            )
        return
    old = yaml.safe_load(cfg_path.read_text()) or {}
    diffs = config_differences(old, config)
    if diffs:
        raise SystemExit(
            f"{out_dir} holds a run with a different config; not overwriting it.\n  "
            + "\n  ".join(diffs)
            + "\nChoose another out_dir=..., or use the same settings to continue that run."
        )
    if not resuming and (out_dir / "metrics.jsonl").exists():
        raise SystemExit(
            f"{out_dir} already holds a run and resume=never; choose another out_dir, or use "
            "resume=auto to continue it"
        )


def git_info() -> dict[str, Any]:
    """Commit and dirty state of the code's repository (empty outside a git checkout)."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
        return out.stdout if out.returncode == 0 else ""

    try:
        commit = git("rev-parse", "HEAD").strip()
        diff = git("diff", "HEAD")
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"commit": commit or None, "dirty": bool(diff.strip()), "diff": diff}


def write_run_files(out_dir: Path, config: dict, extra_meta: dict[str, Any]) -> None:
    """Write the resolved config and run metadata (rank 0 only)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / CONFIG_FILE).write_text(yaml.safe_dump(config, sort_keys=False))
    git = git_info()
    if git.get("diff"):
        (out_dir / "git.diff").write_text(git["diff"])
    meta = {
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "argv": sys.argv,
        "git_commit": git.get("commit"),
        "git_dirty": git.get("dirty"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "host": platform.node(),
        **extra_meta,
    }
    with open(out_dir / "meta.jsonl", "a", encoding="utf-8") as f:  # one line per (re)start
        f.write(json.dumps(meta) + "\n")


def write_summary(out_dir: Path, summary: dict[str, Any]) -> None:
    with atomic_open(out_dir / "summary.json", "w") as f:
        f.write(json.dumps(summary, indent=2) + "\n")
