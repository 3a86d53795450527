"""The named data sources (what ``python -m data.prepare NAME`` prepares) and the validation
splits of the ``split`` layout; ``resolve_source`` also turns a local path into a source."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from data.sources import HubDataset, LocalFiles, SotuCorpus


@dataclass(frozen=True)
class SourceSpec:
    """A named source: where its documents come from and how its shards are laid out."""

    name: str
    prefix: str  # shard names start with it
    layout: str  # "split" | "first-shard"
    val_fraction: float | None = None  # split layout: fraction of documents held out
    seed: int | None = None  # split layout: seed of the draw
    split: str | None = None  # split layout: "choice" (ours) | "nanogpt" (train_test_split)
    hub: tuple[str, str | None] | None = None  # (dataset, config) on the Hugging Face hub
    expected_documents: int | None = None
    download: str = ""  # how to fetch the files that --from reads


def _fineweb(name: str, config: str, folder: str) -> SourceSpec:
    return SourceSpec(
        name,
        "fineweb",
        "first-shard",
        hub=("HuggingFaceFW/fineweb-edu", config),
        download=f'hf download HuggingFaceFW/fineweb-edu --repo-type dataset --include "{folder}/*"'
        f" --local-dir DIR, then --from DIR/{folder}",
    )


SOURCES: dict[str, SourceSpec] = {
    "openwebtext": SourceSpec(
        "openwebtext",
        "openwebtext",
        "split",
        val_fraction=0.0005,
        seed=2357,
        split="nanogpt",
        hub=("Skylion007/openwebtext", None),
        expected_documents=8_013_769,
        download="its parquet files, or the openwebtext-train-*.arrow files of a Hugging Face "
        "datasets cache, in the dataset's row order",
    ),
    "fineweb-edu": _fineweb("fineweb-edu", "sample-10BT", "sample/10BT"),
    "fineweb-edu-100b": _fineweb("fineweb-edu-100b", "sample-100BT", "sample/100BT"),
    "sotu": SourceSpec("sotu", "sotu", "split", val_fraction=0.05, seed=1337, split="choice"),
}
# Sources that need no download, so a training run may prepare them on the fly.
AUTO_PREPARE: frozenset[str] = frozenset({"sotu"})


def split_documents(n_docs: int, *, val_fraction: float, seed: int) -> np.ndarray:
    """Sorted indices of the validation documents: round(val_fraction*n) drawn, at least 1."""
    n_val = _check_split(n_docs, val_fraction, max(1, round(val_fraction * n_docs)))
    return np.sort(np.random.default_rng(seed).choice(n_docs, size=n_val, replace=False))


def nanogpt_split(n_docs: int, *, val_fraction: float, seed: int) -> np.ndarray:
    """Sorted indices of the documents that ``datasets``' ``train_test_split(test_size=
    val_fraction, seed=seed, shuffle=True)`` puts in its test split (nanoGPT's val split)."""
    n_val = _check_split(n_docs, val_fraction, math.ceil(val_fraction * n_docs))
    return np.sort(np.random.default_rng(seed).permutation(n_docs)[:n_val])


def _check_split(n_docs: int, val_fraction: float, n_val: int) -> int:
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must lie in (0, 1), got {val_fraction}; e.g. use 0.05")
    if n_val >= n_docs:
        raise ValueError(
            f"val_fraction {val_fraction} leaves no training documents out of {n_docs}; "
            "use a smaller val_fraction or more documents"
        )
    return n_val


SPLITS = {"choice": split_documents, "nanogpt": nanogpt_split}


def local_name(path: Path) -> str:
    """A shard-name prefix from a file or folder name (letters, digits and dashes)."""
    stem = path.name.split(".")[0] if path.is_file() else path.name
    return re.sub(r"[^A-Za-z0-9-]+", "-", stem).strip("-").lower() or "local"


def resolve_source(
    source: str, *, from_path: str | Path | None = None, name: str | None = None, text_field="text"
) -> tuple[SourceSpec, Any]:
    """The spec and document reader of ``source`` (a name in SOURCES, or a local path)."""
    if source in SOURCES:
        spec = SOURCES[source]
        if from_path is not None:
            if spec.hub is None:
                raise ValueError(f"--from does not apply to {source!r}, which is embedded")
            return spec, LocalFiles(from_path, text_field=text_field)
        if spec.hub is None:
            return spec, SotuCorpus()
        return spec, HubDataset(*spec.hub, text_field=text_field)
    if from_path is not None:
        raise ValueError(f"--from PATH goes with a named source ({', '.join(SOURCES)})")
    path = Path(source)
    if not path.exists():
        raise ValueError(
            f"unknown data source {source!r}: neither a named source (valid sources: "
            f"{', '.join(sorted(SOURCES))}) nor an existing file or folder"
        )
    prefix = local_name(Path(name)) if name else local_name(path)
    spec = SourceSpec(prefix, prefix, "split", val_fraction=0.05, seed=1337, split="choice")
    return spec, LocalFiles(path, text_field=text_field)


def with_overrides(spec: SourceSpec, val_fraction: float | None, seed: int | None) -> SourceSpec:
    """``spec`` with the user's validation fraction and seed (split layout only)."""
    if spec.layout == "first-shard" and (val_fraction is not None or seed is not None):
        raise ValueError(
            f"{spec.name}'s validation set is its first shard (llm.c's layout); "
            "--val-fraction and --seed do not apply (--shard-tokens sets its size)"
        )
    return replace(
        spec,
        val_fraction=spec.val_fraction if val_fraction is None else val_fraction,
        seed=spec.seed if seed is None else seed,
    )
