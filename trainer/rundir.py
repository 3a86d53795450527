"""The run directory: its name, its config (never silently replaced), and run metadata. The
names and formats of its files are runtime/runfiles.py's."""

from __future__ import annotations

import datetime
import hashlib
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import yaml

from runtime import runfiles
from runtime.device import resolve_dtype
from trainer.checks import redact
from trainer.config import RESUMABLE_KEYS, config_differences

# Override keys that do not change what a run computes (those a continuation may change, but
# max_steps, which sets the schedule) and those the name says already: left out of run names, so
# `python train.py` and `python train.py device=cpu progress=false` are one run.
NAME_EXCLUDED = (RESUMABLE_KEYS - {"max_steps"}) | {"hydra", "name", "experiment"}
_MAX_TAG = 120


def override_tag(
    overrides: list[str], name: str = "", exclude: frozenset[str] = NAME_EXCLUDED
) -> str:
    """The part of a run's name that says how it differs: its command-line overrides as
    ``key=value``, sorted by key and joined by commas (``optimizer.lr=0.003,seed=2``), without the
    keys of ``exclude`` or a value that the name already says (``optimizer=mars-adamw``). The
    order on the command line does not matter; a key given twice counts once, with its last value
    (as Hydra does)."""
    chosen: dict[str, str] = {}
    for override in overrides:
        key, sep, value = str(override).lstrip("+~").partition("=")
        if not sep or key.split(".")[0].split("/")[0] in exclude or value == name:
            continue
        chosen[key] = value
    items = sorted(chosen.items())
    tag = ",".join(f"{k}={v}" for k, v in items).replace("/", "-").replace(" ", "")
    if len(tag) > _MAX_TAG:  # too long for a file name: the keys' last parts (lr=0.003), ...
        short = ",".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in items).replace("/", "-")
        if len(short) > _MAX_TAG:  # ... then cut, with a hash that keeps names unique
            short = f"{short[: _MAX_TAG - 9]}-{hashlib.sha1(tag.encode()).hexdigest()[:8]}"
        tag = short.replace(" ", "")
    return tag


def run_dir_name(name: str, overrides: list[str], root: str = "runs") -> str:
    """``runs/<name>[_<overrides>]``: an experiment's name (``owt/small-mars-adamw``) or the
    optimizer's, then what the command line changed. No time stamp: the same command names the
    same directory, so running it again continues the run (docs/failures.md)."""
    tag = override_tag(overrides, name)
    if os.path.isabs(name) or ".." in Path(name).parts:
        raise ValueError(f"name={name}: a run's name is a path inside {root}/ (no '..', not "
                         "absolute); to put a run elsewhere give out_dir=PATH")  # fmt: skip
    base = name.strip("/") or "run"
    return os.path.join(root, f"{base}_{tag}" if tag else base)


def sweep_job_dir_name(swept_overrides: list[str], job_num: int) -> str:
    """A sweep job's directory under the sweep's parent: the values of the swept keys
    (``optimizer.lr=0.003``, ``experiment=owt-small-adamw``), ``job<N>`` if there are none."""
    return override_tag(swept_overrides, exclude=frozenset({"hydra", "out_dir"})) or f"job{job_num}"


def check_run_dir(
    out_dir: Path, config: dict, resuming: bool, resume: str = "auto", device: Any = None
) -> None:
    """Refuse to write into a directory that holds another run.

    The directory may hold a run with the same config (it is then continued from its newest
    checkpoint, or, with resume=auto and no checkpoint yet, started over), or nothing of a run.
    A different config, or an existing run with resume=never, is an error that names the
    differences and the way out. ``dtype`` is compared as the arithmetic it means
    (``same_arithmetic``) where ``device``, this session's, is given.
    """
    if not (out_dir / runfiles.CONFIG).exists():
        leftovers = [name for name in (runfiles.METRICS, runfiles.CHECKPOINTS)
                     if (out_dir / name).exists()]  # fmt: skip
        if leftovers:
            raise SystemExit(
                f"{out_dir} holds run files ({', '.join(leftovers)}) but no {runfiles.CONFIG}; "
                "choose another out_dir or move those files away"
            )
        return
    old = _existing_config(out_dir)
    old, config = same_arithmetic(old, config, last_device(out_dir), device)
    diffs = config_differences(old, config)
    if diffs:
        raise SystemExit(
            f"{out_dir} holds a run with a different config; not overwriting it.\n  "
            + "\n  ".join(diffs)
            + "\nFor a new run, give it another name=NAME (or out_dir=DIR); to continue that run, "
            "use its settings."
        )
    if not resuming and resume != "auto" and (out_dir / runfiles.METRICS).exists():
        raise SystemExit(
            f"{out_dir} already holds a run and resume=never: for a fresh run give it another "
            f"name=NAME (or out_dir=DIR), or delete {out_dir}; resume=auto continues it"
        )


def last_device(out_dir: Path) -> str | None:
    """The device the run in ``out_dir`` last trained on (its newest session in meta.jsonl that
    says), or None."""
    try:
        sessions = runfiles.read_meta(out_dir)
    except OSError:
        return None
    devices = [s["device"] for s in sessions if isinstance(s.get("device"), str)]
    return devices[-1] if devices else None


def same_arithmetic(old: dict, new: dict, old_device: Any, new_device: Any) -> tuple[dict, dict]:
    """``old`` and ``new`` with ``dtype`` as what each means on its device: ``auto`` is float32
    on a CPU and bf16 autocast on a GPU (runtime.device.resolve_dtype). So a run started as
    ``auto`` on a CPU continues as ``dtype=float32``, and a GPU does not continue it in bf16
    unasked (the device itself may change: it is not what a run computes). ``tf32`` is no
    difference where neither session ran on CUDA (a CPU has no TF32). Unchanged where a
    device is unknown (a run dir from before meta.jsonl) or a dtype is not one torch names."""
    devices = (str(old_device), str(new_device))
    if None not in (old_device, new_device) and not any(d.startswith("cuda") for d in devices):
        # ``tf32`` sets CUDA's float32 matmuls only: on CPUs both sessions computed the same
        old = {k: v for k, v in old.items() if k != "tf32"}
        if "tf32" in new:
            old["tf32"] = new["tf32"]
    a, b = old.get("dtype", "auto"), new.get("dtype", "auto")
    if old_device is None or new_device is None or not (isinstance(a, str) and isinstance(b, str)):
        return old, new
    try:
        ra = str(resolve_dtype(a, torch.device(old_device))).removeprefix("torch.")
        rb = str(resolve_dtype(b, torch.device(new_device))).removeprefix("torch.")
    except (ValueError, RuntimeError):
        return old, new
    if ra == rb:
        return {**old, "dtype": ra}, {**new, "dtype": rb}
    said = {"old": a if a == ra else f"{a} ({ra} on {old_device})",
            "new": b if b == rb else f"{b} ({rb} on {new_device})"}  # fmt: skip
    return {**old, "dtype": said["old"]}, {**new, "dtype": said["new"]}


def _existing_config(out_dir: Path) -> dict:
    """The config of the run in ``out_dir``; one line when it cannot be read as one (it was
    edited, or is not this codebase's)."""
    path = out_dir / runfiles.CONFIG
    try:
        old = runfiles.load_config(out_dir)
    except (OSError, yaml.YAMLError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SystemExit(f"{path} is not a readable config ({first}); not touching {out_dir}: "
                         "restore that file, or give this run another name=NAME or "
                         "out_dir=DIR") from None  # fmt: skip
    if old is None:
        return {}
    if not isinstance(old, dict):
        raise SystemExit(f"{path} holds a {type(old).__name__}, not a config mapping; not "
                         f"touching {out_dir}: restore that file, or give this run another "
                         "name=NAME or out_dir=DIR")  # fmt: skip
    return old


# An untracked file up to this size is copied into git.diff (a new optimizer, a config); a
# bigger or binary one (data, weights) is only named, and the run is then not reproducible.
UNTRACKED_MAX_BYTES = 1_000_000


def git_info(root: Path | None = None) -> dict[str, Any]:
    """Commit and dirty state of the code's repository (empty outside a git checkout): ``diff``
    holds the uncommitted changes to tracked files and, as new-file patches, the untracked files
    git does not ignore (``git apply git.diff`` on the commit restores the code)."""
    root = root or Path(__file__).resolve().parent.parent

    def git(*args: str, ok: tuple[int, ...] = (0,)) -> str:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
        return out.stdout if out.returncode in ok else ""

    try:
        commit = git("rev-parse", "HEAD").strip()
        # results/ (a study's published ledgers and reports) are outputs, not the code a run
        # ran: a study publishing a part there must not mark its next runs dirty
        code = ("--", ".", ":(exclude)results")
        diff = git("diff", "HEAD", *code)
        untracked = [f for f in git("ls-files", "--others", "--exclude-standard", "-z", *code)
                     .split("\0") if f]  # fmt: skip
        recorded, skipped = [], []
        for name in untracked:
            if _is_small_text(root / name):
                # exit status 1: the files differ (always, against /dev/null)
                diff += git("diff", "--no-index", "--", "/dev/null", name, ok=(0, 1))
                recorded.append(name)
            else:
                skipped.append(name)
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"commit": commit or None, "dirty": bool(diff.strip() or skipped), "diff": diff,
            "untracked": recorded, "untracked_skipped": skipped,
            "reproducible": bool(commit) and not skipped}  # fmt: skip


def _is_small_text(path: Path) -> bool:
    """A regular file of at most UNTRACKED_MAX_BYTES without a NUL byte (not binary)."""
    try:
        if not path.is_file() or path.stat().st_size > UNTRACKED_MAX_BYTES:
            return False
        return b"\0" not in path.read_bytes()[:8192]
    except OSError:
        return False


def write_run_files(out_dir: Path, config: dict, extra_meta: dict[str, Any]) -> None:
    """Write the resolved config and run metadata (rank 0 only). The session's uncommitted code
    goes to its own diff (runfiles.session_diff), named in its meta line; a start from step 0
    first removes the diffs of the sessions it abandons, so none is read as this run's code."""
    out_dir.mkdir(parents=True, exist_ok=True)
    runfiles.write_config(out_dir, config)
    git = git_info()
    fresh = not extra_meta.get("resume_from")
    if fresh:
        for stale in [out_dir / runfiles.GIT_DIFF, *out_dir.glob(runfiles.SESSION_DIFFS)]:
            stale.unlink(missing_ok=True)
    diff_name = None
    if git.get("diff"):
        # the run's sessions so far: those after its last start from step 0 (meta.jsonl)
        metas = runfiles.read_meta(out_dir)
        starts = [i for i, m in enumerate(metas) if not m.get("resume_from")]
        session = 1 if fresh else len(metas) - (starts[-1] if starts else 0) + 1
        diff_name = runfiles.session_diff(session)
        (out_dir / diff_name).write_text(git["diff"])
    meta = {
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "argv": redact(sys.argv),  # no secret from the environment or the command line
        "git_commit": git.get("commit"),
        "git_dirty": git.get("dirty"),
        "git_diff": diff_name,  # this session's diff file (None: a clean tree)
        # the code is git_commit + git.diff, untracked files included, unless some were too
        # big or binary to copy (named here): then the run says it is not reproducible
        "git_untracked": git.get("untracked", []),
        "git_untracked_skipped": git.get("untracked_skipped", []),
        "reproducible": git.get("reproducible", False),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "host": platform.node(),
        "cpu": runfiles.cpu_name(),  # bit-for-bit reruns hold on the same CPU kind (study.rerun)
        "cpu_capability": runfiles.cpu_capability(),  # and the same vector-kernel level
        **extra_meta,
    }
    runfiles.append_meta(out_dir, meta)  # one line per (re)start
