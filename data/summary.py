"""``prepare.json``: the summary of a prepared directory (documents, tokens, shards, seconds),
written when data/prepare.py finishes and read back to make preparing again with the same
settings a no-op (``load_summary``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from data.shards import read_header
from data.sources import SotuCorpus
from runtime.files import atomic_open

log = logging.getLogger("data.prepare")

SUMMARY_FILE = "prepare.json"


def finish(out_dir: Path, prefix: str, summary: dict) -> dict:
    """Remove stale shards, write ``prepare.json`` and log the summary."""
    remove_stale_shards(out_dir, prefix, summary["shards"]["train"] + summary["shards"]["val"])
    write_json_atomic(out_dir / SUMMARY_FILE, summary)
    log.info(
        "prepared %s in %s: %s documents, %s tokens, %d shards in %.1f s (%s tokens/s)",
        summary["source"],
        out_dir,
        f"{sum(summary['documents'].values()):,}",
        f"{sum(summary['tokens'].values()):,}",
        len(summary["shards"]["train"]) + len(summary["shards"]["val"]),
        summary["seconds"],
        f"{summary['tokens_per_second']:,}",
    )
    return summary


def summarize(settings: dict, result: dict, docs: Any, val_ids: np.ndarray | None) -> dict:
    shards = [s for records in result["shards"].values() for s in records]
    summary: dict = {**settings, "complete": True, "documents": {}, "tokens": {}, "shards": {}}
    for split in ("train", "val"):
        mine = [s for s in shards if f"_{split}_" in s["name"]]
        summary["documents"][split] = sum(s["documents"] for s in mine)
        summary["tokens"][split] = sum(s["tokens"] for s in mine)
        summary["shards"][split] = [s["name"] for s in mine]
    seconds = max(result["seconds"], 1e-9)
    summary["seconds"] = round(seconds, 3)
    summary["tokens_per_second"] = round(sum(summary["tokens"].values()) / seconds)
    if isinstance(docs, SotuCorpus) and val_ids is not None:  # small enough to list
        val = set(val_ids.tolist())
        summary["doc_ids"] = {
            "train": [d for i, d in enumerate(docs.ids) if i not in val],
            "val": [d for i, d in enumerate(docs.ids) if i in val],
        }
    return summary


def write_json_atomic(path: Path, obj: dict) -> None:
    with atomic_open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def load_summary(out_dir: str | Path, settings: dict) -> dict | None:
    """Return the saved summary if ``out_dir`` holds valid shards made with ``settings``."""
    path = Path(out_dir) / SUMMARY_FILE
    try:
        summary = json.loads(path.read_text())
        if any(summary.get(k) != v for k, v in settings.items()):
            log.info("%s was made with other settings; preparing again", path)
            return None
        for split in ("train", "val"):
            found = sum(read_header(Path(out_dir) / n) for n in summary["shards"][split])
            if found != summary["tokens"][split]:
                return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return summary


def remove_stale_shards(out_dir: Path, prefix: str, keep: list[str]) -> None:
    """Delete this prefix's shards left over from an earlier run that made more of them."""
    for split in ("train", "val"):
        for path in out_dir.glob(f"{prefix}_{split}_*.bin"):
            if path.name not in keep:
                log.info("removing stale shard %s", path)
                path.unlink()
