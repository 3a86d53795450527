"""results.csv: one row per finished run of the study, the data every table and figure is made
from (docs/study.md lists the columns)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import yaml

from study.cells import FAILED, Study, finished_loss, lookup
from study.plan import short
from study.runner import result

BASE_COLUMNS = [
    "optimizer", "model", "non_embedding_params", "budget", "tokens", "lr", "seed", "role",
    "final_val_loss", "best_val_loss", "wall_s", "tokens_per_s", "commit",
]  # fmt: skip
MORE_COLUMNS = ["max_steps", "warmup_steps", "min_lr_ratio", "batch_tokens", "chosen", "grid",
                "diverged", "run_dir"]  # fmt: skip


def _commit(run_dir: Path) -> str:
    try:
        first = (run_dir / "meta.jsonl").read_text().splitlines()[0]
        meta = json.loads(first)
    except (OSError, ValueError, IndexError):
        return ""
    return meta.get("git_commit", "")[:12] + ("+dirty" if meta.get("git_dirty") else "")


def _row(study: Study, cell, role: str, run_dir: Path, state) -> dict | None:  # noqa: ANN001
    loss = finished_loss(run_dir, state.max_steps)
    if loss is None:
        return None
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    summary = result(run_dir, state.max_steps) or {}
    keys = study.plan.keys(cell)
    values = {k: float(lookup(cfg, k)) for k in keys}
    elapsed = summary.get("elapsed_s") or math.nan
    tokens = summary.get("tokens") or 0
    row = {
        "optimizer": cell.optimizer, "model": cell.model,
        "non_embedding_params": study.params[cell.model], "budget": cell.budget,
        "tokens": tokens, "lr": values["optimizer.lr"], "seed": cfg["seed"], "role": role,
        "final_val_loss": summary.get("final_val_loss"), "best_val_loss": summary.get("best_val_loss"),
        "wall_s": elapsed, "tokens_per_s": round(tokens / elapsed) if tokens and elapsed else "",
        "commit": _commit(run_dir), "max_steps": cfg["max_steps"],
        "warmup_steps": cfg["schedule"]["warmup_steps"],
        "min_lr_ratio": cfg["schedule"].get("min_lr_ratio"), "batch_tokens": cfg["batch_tokens"],
        "chosen": int(all(math.isclose(values[k], state.chosen.get(k, math.nan)) for k in keys)),
        "grid": ";".join(f"{short(k)}:{state.flags.get(k, 'open')}" for k in keys),
        "diverged": int((run_dir / FAILED).is_file() or math.isinf(loss)),
        "run_dir": str(run_dir.relative_to(study.plan.out)),
    }  # fmt: skip
    row.update({short(k): v for k, v in values.items() if k != "optimizer.lr"})
    return row


def collect(study: Study) -> list[dict]:
    """Every finished run of the plan's cells (their states up to date), selection and
    evaluation."""
    rows = []
    for cell in study.plan.cells():
        state = study.states.get(cell) or study.update(cell)
        for role in ("select", "eval"):
            for cfg_file in sorted((study.plan.cell_dir(cell) / role).glob("*/config.yaml")):
                if (row := _row(study, cell, role, cfg_file.parent, state)) is not None:
                    rows.append(row)
    return rows


def write_csv(rows: list[dict], path: Path) -> None:
    extra = sorted({k for r in rows for k in r} - set(BASE_COLUMNS) - set(MORE_COLUMNS))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=BASE_COLUMNS + extra + MORE_COLUMNS, restval="")
        w.writeheader()
        w.writerows(rows)


def read_csv(path: Path) -> list[dict]:
    """results.csv back, numbers as floats (the report reads only this file)."""
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            for k, v in r.items():
                try:
                    r[k] = float(v)
                except (TypeError, ValueError):
                    pass
            rows.append(r)
    return rows
