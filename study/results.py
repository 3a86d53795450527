"""results.csv: one row per finished run of the study, the data every table and figure is made
from (docs/study.md lists the columns)."""

from __future__ import annotations

import csv
import math
import re
import shlex
from pathlib import Path

from runtime import runfiles
from study.curves import collapse_reason, run_curves
from study.knobs import ran_values
from study.ledger import read_csv  # noqa: F401 - results.csv's reader, read by the report
from study.plan import split_variant
from study.runner import result
from study.state import FAILED, Study, finished_loss

BASE_COLUMNS = [
    "optimizer", "model", "non_embedding_params", "budget", "tokens", "lr", "seed", "role",
    "final_val_loss", "best_val_loss", "wall_s", "tokens_per_s", "commit",
]  # fmt: skip
MORE_COLUMNS = ["max_steps", "warmup_steps", "min_lr_ratio", "batch_tokens", "chosen", "grid",
                "diverged", "collapsed", "collapse", "run_dir", "cpu", "command"]  # fmt: skip


def _commit(run_dir: Path) -> str:
    """The run's commit; ``+dirty`` when tracked files differed from it (or an untracked file was
    too big to record), ``+untracked(a;b)`` when the only difference was untracked files beside
    the checkout (a log, say: the tracked code is the commit's; the files are in git.diff)."""
    metas = runfiles.read_meta(run_dir)
    if not metas:
        return ""
    meta = metas[0]
    commit = (meta.get("git_commit") or "")[:12]
    if not meta.get("git_dirty"):
        return commit
    untracked = [str(f) for f in meta.get("git_untracked") or []]
    diff = run_dir / runfiles.GIT_DIFF
    changed = re.findall(r"^diff --git a/(\S+) b/", diff.read_text(errors="replace"), re.M) if (
        diff.is_file()
    ) else []  # fmt: skip
    if meta.get("git_untracked_skipped") or not untracked or set(changed) - set(untracked):
        return commit + "+dirty"
    return commit + f"+untracked({';'.join(sorted(untracked))})"


def _cpu(run_dir: Path) -> str:
    """The CPU the run started on (meta.jsonl; empty for runs recorded before it was)."""
    metas = runfiles.read_meta(run_dir)
    return str(metas[0].get("cpu") or "") if metas else ""


def parse_run_name(name: str, keys: list[str]) -> dict[str, float]:
    """``lr-0.004_aux_lr-0.002_seed-1`` with ``keys`` ``["lr", "aux_lr"]`` -> the values and
    the seed (the keys in order, so a key holding ``_`` parses)."""
    out: dict[str, float] = {}
    rest = name
    for k in [*keys, "seed"]:
        prefix = f"{k}-"
        if not rest.startswith(prefix):
            raise ValueError(f"run directory {name!r} does not spell the keys {keys}")
        rest = rest[len(prefix) :]
        value, _, rest = rest.partition("_") if k != "seed" else (rest, "", "")
        while rest and not any(rest.startswith(f"{n}-") for n in [*keys, "seed"]):
            more, _, rest = rest.partition("_")  # a value that held "_" (none do today)
            value = f"{value}_{more}"
        out[k] = float(value)
    return out


def _row(study: Study, cell, role: str, run_dir: Path, state, floor, curve) -> dict | None:  # noqa: ANN001
    loss = finished_loss(run_dir, state.max_steps)
    if loss is None:
        return None
    cfg = runfiles.read_config(run_dir) or {}
    summary = result(run_dir, state.max_steps) or {}
    keys = study.plan.keys(cell)
    values = parse_run_name(run_dir.name, keys)
    elapsed = summary.get("elapsed_s") or math.nan
    tokens = summary.get("tokens") or 0
    reason = collapse_reason(loss, floor, curve)
    row = {
        "optimizer": cell.optimizer, "model": cell.model,
        "non_embedding_params": study.params[cell.model], "budget": cell.budget,
        "tokens": tokens, "lr": values.get("lr", cfg["optimizer"].get("lr")),
        "seed": int(values["seed"]), "role": role,
        "final_val_loss": summary.get("final_val_loss"), "best_val_loss": summary.get("best_val_loss"),
        "wall_s": elapsed, "tokens_per_s": round(tokens / elapsed) if tokens and elapsed else "",
        "commit": _commit(run_dir), "max_steps": cfg["max_steps"],
        "warmup_steps": cfg["schedule"]["warmup_steps"],
        "min_lr_ratio": cfg["schedule"].get("min_lr_ratio"), "batch_tokens": cfg["batch_tokens"],
        "chosen": int(all(math.isclose(values[k], state.chosen.get(k, math.nan)) for k in keys)),
        "grid": ";".join(f"{k}:{state.flags.get(k, 'open')}" for k in keys)
                + (";passes:capped" if state.flags.get("passes") == "capped" else ""),
        "diverged": int((run_dir / FAILED).is_file() or math.isinf(loss)),
        "collapsed": int(bool(reason)), "collapse": reason,
        "run_dir": str(run_dir.relative_to(study.plan.out)), "cpu": _cpu(run_dir),
    }  # fmt: skip
    row.update({k: v for k, v in values.items() if k not in ("lr", "seed")})
    base = split_variant(cell.optimizer)[0]
    for k, v in ran_values(base, cfg).items():  # carried knobs too: what the run ran with
        if k != "lr":
            row.setdefault(k, v)
    row["command"] = _command(run_dir)
    return row


def _command(run_dir: Path) -> str:
    """The run's train.py overrides as recorded (meta.jsonl), without its out_dir: what
    study.rerun and study.predict need to run it again from the ledger alone."""
    metas = runfiles.read_meta(run_dir)
    argv = [str(a) for a in (metas[0].get("argv") or [])[1:]] if metas else []
    return shlex.join(a for a in argv if not a.startswith("out_dir="))


def _ledger_row(study: Study, cell, run_id: str, state) -> dict:  # noqa: ANN001
    """The ledger's row of a run whose directory is gone, as it was written, its ``chosen`` and
    ``grid`` read anew from the cell's state."""
    keys = study.plan.keys(cell)
    typed = study.ledger.rows[run_id]
    row = {k: v for k, v in study.ledger.raw[run_id].items() if v != ""}
    row["chosen"] = int(all(math.isclose(float(typed.get(k, math.nan)),
                                         state.chosen.get(k, math.nan)) for k in keys))  # fmt: skip
    row["grid"] = ";".join(f"{k}:{state.flags.get(k, 'open')}" for k in keys) + (
        ";passes:capped" if state.flags.get("passes") == "capped" else ""
    )
    return row


def collect(study: Study, floor: float | None = None) -> tuple[list[dict], dict[str, list]]:
    """Every finished run of the plan's cells (their states up to date), selection and
    evaluation, and their curves (``{run_dir: records}``): from the run directories, and from
    the study's ledger for the runs whose directories are gone (study/ledger.py)."""
    rows, curves = [], {}
    for cell in study.plan.cells():
        state = study.states.get(cell) or study.update(cell)
        for role in ("select", "eval"):
            role_dir = study.plan.cell_dir(cell) / role
            found: dict[str, dict] = {}
            for cfg_file in sorted(role_dir.glob(f"*/{runfiles.CONFIG}")):
                curve = run_curves(cfg_file.parent)
                row = _row(study, cell, role, cfg_file.parent, state, floor, curve)
                if row is not None:
                    found[row["run_dir"]] = row
                    curves[row["run_dir"]] = curve
            prefix = study.run_id(role_dir) + "/"
            for run_id in study.ledger.rows:
                rest = run_id[len(prefix) :]
                if run_id.startswith(prefix) and "/" not in rest and run_id not in found:
                    found[run_id] = _ledger_row(study, cell, run_id, state)
                    curves[run_id] = study.ledger.curves.get(run_id, [])
            rows += [found[k] for k in sorted(found)]
    return rows, curves


def write_csv(rows: list[dict], path: Path) -> None:
    extra = sorted({k for r in rows for k in r} - set(BASE_COLUMNS) - set(MORE_COLUMNS))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=BASE_COLUMNS + extra + MORE_COLUMNS, restval="")
        w.writeheader()
        w.writerows(rows)
