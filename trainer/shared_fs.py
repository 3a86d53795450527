"""Several nodes: the files every rank must see alike, checked before training starts.

Rank 0 alone prepares the data (``data.ensure_prepared``) and writes the run directory (config,
metrics, single-file checkpoints, which every rank reads back on resume); DCP checkpoints are
written by every rank into one directory. So on several nodes ``out_dir`` must be one directory
that every node sees, and ``data.dir`` must hold the same shards on every node (shared, or
copied alike). Without this check a node that does not see them fails on its own (a missing
shard file, a checkpoint it cannot find) while the others wait in a collective until the
30-minute timeout: a hang, not an error.

``check_shared_files``: rank 0 writes a marker file with a fresh token into ``out_dir``; then
every rank looks for it (waiting up to ``WAIT_S`` for a network filesystem's caches) and
lists ``data.dir``'s shards; the findings are gathered, and if any rank differs from rank 0 every
rank stops with the same one-line message naming the directory, the ranks and their hosts.
"""

from __future__ import annotations

import logging
import platform
import time
import uuid
from pathlib import Path

from data import shard_files
from data.config import DataConfig
from runtime.distributed import DistInfo, broadcast_object, gather_objects

log = logging.getLogger(__name__)

MARKER_PREFIX = ".shared-fs-check-"
WAIT_S = 10.0  # how long a rank waits for rank 0's marker (NFS attribute caches) before failing
HINT = 'docs/training.md, "Several nodes"'


def _sees(marker: Path, token: str, wait_s: float) -> bool:
    """Whether ``marker`` holds ``token``, polled for up to ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if marker.read_text() == token:
                return True
        except OSError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def _shard_listing(data: DataConfig) -> list[tuple[str, int]] | None:
    """(name, size) of every train and val shard this rank sees; None when it sees none."""
    try:
        train, val = shard_files(data)
    except FileNotFoundError:
        return None
    return [(p.name, p.stat().st_size) for p in [*train, *val]]


def _write_marker(out_dir: Path, token: str) -> str | None:
    """Rank 0's marker in ``out_dir``; the error text if it cannot be written."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"{MARKER_PREFIX}{token}").write_text(token)
    except OSError as exc:
        return f"rank 0 cannot write to out_dir {out_dir}: {exc}"
    return None


def describe_problems(findings: list[dict], out_dir: Path, data_dir: str) -> str:
    """One line naming what differs between the ranks' ``findings``; empty when nothing does."""
    if findings[0].get("error"):
        return f"{findings[0]['error']} ({HINT})"

    def where(ranks: list[int]) -> str:
        return ", ".join(f"rank {r} (host {findings[r]['host']})" for r in ranks)

    problems = []
    blind = [r for r, f in enumerate(findings) if not f["out_dir"]]
    if blind:
        problems.append(
            f"out_dir {out_dir} is not one directory shared by every node: {where(blind)} "
            f"does not see the file rank 0 wrote there; on several nodes put out_dir on a "
            f"filesystem every node mounts at the same path"
        )
    other = [r for r, f in enumerate(findings) if f["data"] != findings[0]["data"]]
    if other:
        problems.append(
            f"data.dir {data_dir} differs between the nodes: {where(other)} sees "
            f"{'no' if any(findings[r]['data'] is None for r in other) else 'other'} token "
            f"shards than rank 0, which alone prepares the data; put data.dir on a shared "
            f"filesystem, or the same shards on every node"
        )
    return "; ".join(problems) + f" ({HINT})" if problems else ""


def check_shared_files(dist: DistInfo, out_dir: Path, data: DataConfig) -> None:
    """Stop every rank with one line if ``out_dir`` or ``data.dir`` is not the same on every
    rank (module docstring); a no-op with one process."""
    if not dist.distributed:
        return
    token = broadcast_object(uuid.uuid4().hex if dist.is_main else None)
    # The broadcast also orders the ranks: none looks before rank 0 has written (or failed to).
    error = broadcast_object(_write_marker(out_dir, token) if dist.is_main else None)
    marker = out_dir / f"{MARKER_PREFIX}{token}"
    findings = gather_objects({
        "host": platform.node(),
        "error": error,
        "out_dir": error is None and _sees(marker, token, WAIT_S),
        "data": _shard_listing(data),
    })  # fmt: skip
    if dist.is_main:
        marker.unlink(missing_ok=True)  # every rank has looked: the gather waited for them
    # Rank 0's names in the message, so that every rank prints the same line.
    out_name, data_name = broadcast_object((str(out_dir), data.dir))
    problems = describe_problems(findings, Path(out_name), data_name)
    if problems:
        raise SystemExit(problems)
    log.debug("out_dir and data.dir are the same on all %d ranks", dist.world_size)
