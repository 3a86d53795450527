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
# Written only where a row has them: ledgers written before they were read back unchanged.
# before "command": the optimizer's routes (routes_text) and, for a run on an accelerator, its
# name (a GPU row and a CPU row of one cell share a comparison only statistically), the
# arithmetic every run ran in (``dtype``, ``tf32``: ``arithmetic``) and, for a resumed run,
# its later sessions (_resumed)
LATER_COLUMNS = ["routes", "device", "dtype", "tf32", "resumed"]


def _sessions(run_dir: Path) -> list[dict]:
    """The sessions of meta.jsonl that made the run's result: the last one that started from step
    0 (a session before it was abandoned and the run started over) and those that resumed it."""
    metas = runfiles.read_meta(run_dir)
    fresh = [i for i, m in enumerate(metas) if not m.get("resume_from")]
    return metas[fresh[-1] :] if fresh else metas


def _commit(run_dir: Path) -> str:
    """The commit the run started under (its last start from step 0, _sessions); ``+dirty`` when
    tracked files differed from it (or an untracked file was too big to record),
    ``+untracked(a;b)`` when the only difference was untracked files beside the checkout (a log,
    say: the tracked code is the commit's; the files are in git.diff). A resumed run's later
    sessions are in ``resumed`` (_resumed)."""
    metas = _sessions(run_dir)
    return _code(run_dir, metas[0], first=True) if metas else ""


def _code(run_dir: Path, meta: dict, *, first: bool) -> str:
    """One session's commit with its ``+dirty`` or ``+untracked(...)`` (_commit), read from the
    session's own diff: its meta line's ``git_diff``; a session recorded before that field, from
    git.diff if it started the run, else ``+dirty`` for any unclean tree (its diff is lost)."""
    commit = (meta.get("git_commit") or "")[:12]
    if not meta.get("git_dirty"):
        return commit
    name = meta.get("git_diff") or (runfiles.GIT_DIFF if first else None)
    diff = run_dir / name if name else None
    untracked = [str(f) for f in meta.get("git_untracked") or []]
    if diff is None or not diff.is_file():
        changed = [] if first else ["?"]  # a resumed session's lost diff: no reading of it
    else:
        changed = re.findall(r"^diff --git a/(\S+) b/", diff.read_text(errors="replace"), re.M)
    if meta.get("git_untracked_skipped") or not untracked or set(changed) - set(untracked):
        return commit + "+dirty"
    return commit + f"+untracked({';'.join(sorted(untracked))})"


def _resumed(run_dir: Path) -> str:
    """Every later session of a resumed run, ``STEP@COMMIT`` (the checkpoint's step, the commit it
    went on under, with ``+dirty`` or ``+untracked(...)`` as ``commit``'s, from the session's own
    diff), then `` on GPU`` where it ran on another device than the first session;
    ``; ``-separated. Empty for a run that ran in one session."""
    metas = _sessions(run_dir)
    out = []
    first_gpu = metas[0].get("gpu") if metas else None
    for meta in metas[1:]:
        step = re.search(r"step_(\d+)", str(meta.get("resume_from") or ""))
        text = f"{int(step.group(1)) if step else '?'}@{_code(run_dir, meta, first=False)}"
        if meta.get("gpu") != first_gpu:
            text += f" on {meta.get('gpu') or 'cpu'}"
        out.append(text)
    return "; ".join(out)


def _cpu(run_dir: Path) -> str:
    """The CPU the run started on and torch's vector-kernel level there, ``AMD EPYC (AVX512)``
    (meta.jsonl; the level only for runs that recorded it, empty for runs recorded before
    either was)."""
    metas = _sessions(run_dir)
    if not metas:
        return ""
    cpu, level = str(metas[0].get("cpu") or ""), metas[0].get("cpu_capability")
    return f"{cpu} ({level})" if cpu and level else cpu


def ran_keys(cfg: dict, optimizer: str, keys: list[str]) -> dict[str, float]:
    """The values of the tuned ``keys`` and the seed that a run ran with, from its own resolved
    config (config.yaml), never from its directory's name: a knob through ``ran_values``, a
    variant's own key (``mars-adamw:eps=tuned``) from its optimizer field."""
    ran = ran_values(split_variant(optimizer)[0], cfg)
    out: dict[str, float] = {}
    for k in keys:
        value = ran.get(k, cfg["optimizer"].get(k))
        if value is None:
            raise ValueError(f"the run's config.yaml has no value of the tuned key {k!r}")
        out[k] = float(value)
    out["seed"] = float(cfg["seed"])
    return out


def routes_text(summary: dict) -> str:
    """summary.json's ``optimizer_routes`` (the route each bucket took, and why: optim/routes.py)
    as ``engine:3;foreach:2`` (buckets per route); empty for a run recorded before it was."""
    routes = summary.get("optimizer_routes") or {}
    return ";".join(f"{r}:{int(v.get('buckets', 0))}" for r, v in sorted(routes.items()))


def _row(study: Study, cell, role: str, run_dir: Path, state, floor, curve) -> dict | None:  # noqa: ANN001
    loss = finished_loss(run_dir, state.max_steps)
    if loss is None:
        return None
    cfg = runfiles.read_config(run_dir) or {}
    summary = result(run_dir, state.max_steps) or {}
    keys = study.plan.keys(cell)
    values = ran_keys(cfg, cell.optimizer, keys)
    elapsed = summary.get("elapsed_s") or math.nan
    tokens = summary.get("tokens") or 0
    reason = collapse_reason(loss, floor, curve)
    row = {
        "optimizer": cell.optimizer, "model": cell.model,
        "non_embedding_params": study.params[cell.model], "budget": cell.budget,
        "tokens": tokens, "lr": values.get("lr", float(cfg["optimizer"]["lr"])),
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
    if routes_text(summary):  # none recorded (an older run): no column from this row
        row["routes"] = routes_text(summary)
    metas = _sessions(run_dir)
    if metas and metas[0].get("gpu"):  # a CPU run (every run before the field): no column
        row["device"] = str(metas[0]["gpu"])
    row["dtype"], row["tf32"] = arithmetic(cfg, bool(metas and metas[0].get("gpu")))
    row.update({k: v for k, v in values.items() if k not in ("lr", "seed")})
    base = split_variant(cell.optimizer)[0]
    for k, v in ran_values(base, cfg).items():  # carried knobs too: what the run ran with
        if k != "lr":
            row.setdefault(k, v)
    if _resumed(run_dir):  # a run of one session (every run before checkpointing): no column
        row["resumed"] = _resumed(run_dir)
    row["command"] = _command(run_dir)
    return row


def arithmetic(cfg: dict, on_gpu: bool) -> tuple[str, str]:
    """The ledger's ``dtype`` and ``tf32`` of a run, from its own resolved config: the dtype its
    ``dtype`` setting meant on the device it ran on (``gpu_dtype``; a CPU run is float32 unless
    it says otherwise), and its ``tf32`` setting as 1 or 0, blank for a run whose config has no
    ``tf32`` (a run from before the key: its TF32 went unrecorded)."""
    setting = str(cfg.get("dtype", "auto"))
    if on_gpu:
        dtype = gpu_dtype(setting)  # bf16 autocast or float32
    else:
        dtype = "float32" if setting in ("auto", "float32", "fp32") else gpu_dtype(setting)
    tf32 = cfg.get("tf32")
    return dtype, "" if tf32 is None else str(int(bool(tf32)))


def gpu_dtype(setting: str) -> str:
    """The arithmetic a GPU run's ``dtype`` setting meant (runtime/device.py ``resolve_dtype``:
    auto is bf16 autocast on CUDA); a CPU run is float32 unless it says otherwise."""
    return {"auto": "bfloat16", "bf16": "bfloat16", "fp32": "float32"}.get(setting, setting)


def _command(run_dir: Path) -> str:
    """The run's train.py overrides as recorded (meta.jsonl), without its out_dir: what
    study.rerun and study.findings.predict need to run it again from the ledger alone."""
    metas = _sessions(run_dir)
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
    check_against_ledger(study, rows)
    return rows, curves


MATCHED = ("final_val_loss", "seed", "max_steps", "batch_tokens", "lr")  # a run's own values


def check_against_ledger(study: Study, rows: list[dict]) -> None:
    """The study's ledger against the rows about to replace it: every run it holds is among
    them (a ledger is never rewritten with fewer or other rows than it read), and where a
    run's directory is there its row's values are the run's own (a hand edit is refused, not
    silently replaced). A LedgerError naming the ledger's line."""
    from study.ledger import FIX, LedgerError

    ledger = study.ledger
    if ledger.path is None:
        return
    fix = FIX.replace("FILE", str(ledger.path))
    by_id = {str(r["run_dir"]): r for r in rows}
    for run_id, old in ledger.rows.items():
        where = f"{ledger.path}:{ledger.lines.get(run_id, '?')}"
        new = by_id.get(run_id)
        if new is None:
            raise LedgerError(f"{where}: run {run_id} is not one of this study's runs (its plan "
                              "has no such run, or its directory is there unfinished): the "
                              f"rewritten ledger would lose it; nothing was written: {fix}")  # fmt: skip
        if (study.plan.out / run_id).is_dir():
            for col in MATCHED:
                a, b = old.get(col), new.get(col)
                if isinstance(a, float) and isinstance(b, int | float) and not isinstance(b, bool):
                    if not math.isclose(a, float(b), rel_tol=1e-12):
                        raise LedgerError(f"{where}: run {run_id}'s {col} {a!r} is not its run's "
                                          f"({b!r}, from {study.plan.out / run_id}): edited by "
                                          f"hand? nothing was written: {fix}")  # fmt: skip


def write_csv(rows: list[dict], path: Path) -> None:
    """The rows as results.csv: the base columns, the knob columns, then the rest; a later column
    (LATER_COLUMNS) only where some row has it, blank in the rows without it."""
    have = {k for r in rows for k in r}
    later = [k for k in LATER_COLUMNS if k in have]
    extra = sorted(have - set(BASE_COLUMNS) - set(MORE_COLUMNS) - set(later))
    more = MORE_COLUMNS[:-1] + later + MORE_COLUMNS[-1:]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=BASE_COLUMNS + extra + more, restval="")
        w.writeheader()
        w.writerows(rows)
