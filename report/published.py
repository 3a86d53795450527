"""The published tables of ``docs/published.yaml`` (validation loss and downstream accuracy)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


@dataclass
class Published:
    """The published tables: ``kind`` val_loss (label -> size -> token column -> loss) or downstream."""

    tables: list[dict[str, Any]]

    @classmethod
    def load(cls, path: Path) -> Published:
        """Read and check ``path``; a malformed file is a ValueError naming what is wrong."""
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"cannot read the published results {path}: {exc}") from None
        tables = (data or {}).get("tables") if isinstance(data, dict) else None
        if not isinstance(tables, list):
            raise ValueError(f"{path}: expected a top-level 'tables' list")
        for i, t in enumerate(tables):
            need = ("id", "kind", "source", "dataset") + (
                ("values",) if t.get("kind") == "val_loss" else ("size", "rows")
            )
            missing = [k for k in need if k not in t]
            if missing or t["kind"] not in ("val_loss", "downstream"):
                raise ValueError(
                    f"{path}: table {i} ({t.get('id', '?')}) needs kind val_loss or downstream "
                    f"and keys {list(need)}; missing {missing}"
                )
        return cls(tables)

    def of_kind(self, kind: str, dataset: str) -> list[dict[str, Any]]:
        return [t for t in self.tables if t["kind"] == kind and t["dataset"] == dataset]

    def val_loss(self, dataset: str, size: str, label: str, column: str) -> dict | None:
        """``{value, approximate, source}`` for one cell; exact tables win over plot readings."""
        hits = []
        for t in self.of_kind("val_loss", dataset):
            value = ((t["values"].get(label) or {}).get(size) or {}).get(column)
            if value is not None:
                hits.append(
                    {
                        "value": float(value),
                        "approximate": bool(t.get("approximate")),
                        "source": t["id"],
                    }
                )
        return min(hits, key=lambda h: h["approximate"], default=None)

    def downstream(self, dataset: str, size: str) -> dict[str, Any] | None:
        return next((t for t in self.of_kind("downstream", dataset) if t["size"] == size), None)

    def paper_cells(self, dataset: str) -> dict[tuple[str, str], list[str]]:
        """(size, label) -> ids of the tables with that run (reference rows excluded)."""
        cells: dict[tuple[str, str], list[str]] = {}
        for t in self.tables:
            if t["dataset"] != dataset:
                continue
            if t["kind"] == "val_loss":
                pairs = [(s, lab) for lab, sizes in t["values"].items() for s in sizes]
            else:
                pairs = [(t["size"], r["label"]) for r in t["rows"] if not r.get("reference")]
            for pair in pairs:
                cells.setdefault(pair, []).append(t["id"])
        return cells
