"""Reading run directories for ``python -m report``: config, metrics, summary and evaluations.

A run directory holds ``config.yaml`` and ``metrics.jsonl`` (and, once its session ended,
``summary.json``; after evaluation, ``eval/step_N.json`` from eval.py and/or lm-eval-harness's
``eval/**/results_*.json``; ``meta.jsonl`` says where it ran, see ``report/conditions.py``). The
downstream tasks, their columns and metrics are ``evals/tasks.py``'s. Everything here is read-only and tolerant: a run still being written
(a truncated last metrics line) or a half-broken one yields what it has, and problems are
collected as warning strings for the report instead of being raised or printed.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from evals import tasks as et
from report.conditions import Conditions, read_conditions
from runtime import runfiles

DATASET_NAMES = {
    "openwebtext": "OpenWebText",
    "fineweb-edu-100b": "FineWeb-Edu",
    "fineweb-edu": "FineWeb-Edu",
}
PAPER_DATASETS = ("OpenWebText", "FineWeb-Edu")
SIZES = ("small", "medium", "large", "xl")
SIZE_NAMES = {"small": "Small", "medium": "Medium", "large": "Large", "xl": "XL"}
OPTIMIZER_LABELS = {"adamw": "AdamW", "muon": "Muon", "moonlight": "Moonlight", "mars-m": "MARS-M"}
# Rows in the paper's order; other labels follow alphabetically.
LABEL_ORDER = (
    "AdamW",
    "Muon",
    "Moonlight",
    "MARS-exact",
    "MARS-approx",
    "MARS-M",
    "MARS-M (γ=0.01)",
    "MARS-M-exact",
)

# Top-level config keys that do not change what a run computes (plus data.dir: where the shards
# live on this machine, not what they are). Runs differing only in these and the seed are seeds
# of one variant.
BOOKKEEPING_KEYS = frozenset({
    "out_dir", "name", "wandb", "progress", "device", "compile", "log_every", "ckpt_every",
    "keep_checkpoints", "resume", "eval_every", "micro_batch_size", "seed", "data.dir",
})  # fmt: skip


def dataset_label(name: str) -> str:
    """OpenWebText / FineWeb-Edu for the paper's datasets, else the data config's name."""
    return DATASET_NAMES.get(name, name)


def size_key(model_name: str) -> str:
    """small/medium/large/xl for ``gpt2-*`` models, else the model's name."""
    return model_name.removeprefix("gpt2-") if model_name.startswith("gpt2-") else model_name


def size_name(size: str) -> str:
    return SIZE_NAMES.get(size, size)


def optimizer_label(opt: dict[str, Any]) -> str:
    """The row label of an optimizer config, as the papers name it.

    mars-adamw is MARS-approx / MARS-exact; adamw, muon, moonlight and mars-m are AdamW, Muon,
    Moonlight and MARS-M; others keep their registry name. Exact mode appends "-exact", a
    mars-m run with gamma 0.01 is "MARS-M (γ=0.01)" (the MARS-M paper's second curve), and a
    gamma schedule says so: "MARS-approx (γ linear to 0)" (optim/schedules.py).
    """
    name = str(opt.get("name", "unknown"))
    exact = opt.get("mode") == "exact"
    if name == "mars-adamw":
        label = "MARS-exact" if exact else "MARS-approx"
    else:
        label = OPTIMIZER_LABELS.get(name, name) + ("-exact" if exact else "")
    gamma = opt.get("gamma")
    if name == "mars-m" and isinstance(gamma, int | float) and math.isclose(gamma, 0.01):
        label += " (γ=0.01)"
    schedule = opt.get("gamma_schedule", "constant")
    if schedule != "constant":  # another idea than the constant-gamma optimizer: its own row
        label += f" (γ {schedule} to {opt.get('gamma_end', 0.0):g})"
    return label


def order_key(kind: str, value: str) -> tuple[int, tuple]:
    """Sort key putting the paper's datasets, sizes or optimizer labels first, in its order;
    others follow with their numbers compared as numbers (tiny-64 before tiny-128)."""
    known = {"dataset": PAPER_DATASETS, "size": SIZES, "label": LABEL_ORDER}[kind]
    if value in known:
        return known.index(value), ()
    parts = re.split(r"(\d+)", value.lower())  # text at even positions, numbers at odd ones
    return len(known), tuple(int(p) if i % 2 else p for i, p in enumerate(parts))


def to_float(value: Any) -> float | None:
    """A metrics value as a float: numbers, and the strings "nan"/"inf" the logger writes."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"optimizer": {"lr": 1}}`` -> ``{"optimizer.lr": 1}`` (lists kept as values)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@dataclass
class EvalPoint:
    """One validation-loss record: after ``step`` steps and ``tokens`` tokens."""

    step: int
    tokens: float
    loss: float
    elapsed_s: float | None


@dataclass
class Downstream:
    """Zero-shot scores of one run (fractions) and where each came from."""

    scores: dict[str, float] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)  # task -> "lm-eval" | "eval.py step N"
    notes: list[str] = field(default_factory=list)  # e.g. validation splits, a --limit

    def source(self) -> str:
        """One phrase naming the source(s), e.g. ``lm-eval`` or ``eval.py step 1000 (7 tasks)``."""
        kinds = sorted(set(self.sources.values()))
        if len(kinds) == 1:
            text = kinds[0]
        else:
            count = {k: sum(v == k for v in self.sources.values()) for k in kinds}
            text = " + ".join(f"{k} ({count[k]} tasks)" for k in kinds)
        return text + (f"; {'; '.join(self.notes)}" if self.notes else "")


@dataclass
class Run:
    """One run directory, read."""

    path: Path
    config: dict[str, Any]
    records: int
    evals: list[EvalPoint]
    summary: dict[str, Any] | None
    steps: int = 0  # the most steps any record (or the summary) reports
    tokens: float = 0.0  # likewise tokens
    downstream: Downstream | None = None
    warnings: list[str] = field(default_factory=list)
    conditions: Conditions = field(default_factory=Conditions)

    @property
    def dataset(self) -> str:
        return dataset_label(str((self.config.get("data") or {}).get("name", "unknown")))

    @property
    def model(self) -> str:
        return str((self.config.get("model") or {}).get("name", "unknown"))

    @property
    def size(self) -> str:
        return size_key(self.model)

    @property
    def label(self) -> str:
        return optimizer_label(self.config.get("optimizer") or {})

    @property
    def seed(self) -> Any:
        return self.config.get("seed")

    @property
    def max_steps(self) -> int | None:
        value = self.config.get("max_steps")
        return int(value) if isinstance(value, int | float) else None

    @property
    def finished(self) -> bool:
        """summary.json exists and records at least max_steps steps (runtime/runfiles.py)."""
        return runfiles.reached(self.summary, self.max_steps)

    @property
    def variant_items(self) -> dict[str, Any]:
        """The config with bookkeeping keys and the seed removed: equal for seeds of a variant."""
        flat = flatten(self.config)
        return {
            k: v
            for k, v in flat.items()
            if k not in BOOKKEEPING_KEYS and k.split(".")[0] not in BOOKKEEPING_KEYS
        }

    @property
    def best_val_loss(self) -> float | None:
        return self.best_within(None)

    def trained_evals(self, tokens: float | None) -> list[EvalPoint]:
        """The evals after step 0 at <= ``tokens`` tokens (None: all). The step-0 eval is the
        untrained model's loss: it is never the loss "at" a token column, however early the column."""
        return [p for p in self.evals if p.step > 0 and (tokens is None or p.tokens <= tokens)]

    def best_within(self, tokens: float | None) -> float | None:
        """Best validation loss among ``trained_evals(tokens)``; None when there is none."""
        return min((p.loss for p in self.trained_evals(tokens)), default=None)

    def last_eval_within(self, tokens: float | None) -> float | None:
        """Tokens of the last of ``trained_evals(tokens)``; None when there is none."""
        return max((p.tokens for p in self.trained_evals(tokens)), default=None)


def eval_points(records: list[dict[str, Any]], where: Path, warnings: list[str]) -> list[EvalPoint]:
    """Validation records in step order (the last record of a step wins), finite losses only.

    ``elapsed_s`` comes from the eval record, else from any record of the same step.
    """
    elapsed = {}
    for r in records:
        if to_float(r.get("elapsed_s")) is not None:
            elapsed[r["step"]] = to_float(r["elapsed_s"])
    points: dict[int, EvalPoint] = {}
    for r in records:
        if "val_loss" not in r:
            continue
        loss, step = to_float(r["val_loss"]), int(r["step"])
        if loss is None or not math.isfinite(loss):
            warnings.append(f"{where}: val_loss is {r['val_loss']} at step {step} (diverged?)")
            points.pop(step, None)
            continue
        tokens = to_float(r.get("tokens")) or 0.0
        points[step] = EvalPoint(step, tokens, loss, elapsed.get(step))
    return [points[s] for s in sorted(points)]


def eval_py_scores(run_dir: Path, warnings: list[str]) -> Downstream | None:
    """Scores from the highest step's ``eval/step_N.json`` written by eval.py."""
    files = []
    for p in (run_dir / runfiles.EVAL).glob("step_*.json"):
        m = re.fullmatch(r"step_(\d+)\.json", p.name)
        if m:
            files.append((int(m.group(1)), p))
    if not files:
        return None
    step, path = max(files)
    data = runfiles.read_json(path, warnings)
    if data is None:
        return None
    out = Downstream()
    for task, entry in (data.get("results") or {}).items():
        if task not in et.TASKS or not isinstance(entry, dict):
            continue
        value = to_float(entry.get(entry.get("metric", et.TASKS[task].metric)))
        if value is None:
            continue
        out.scores[task] = value
        out.sources[task] = f"eval.py step {step}"
        if entry.get("split") and entry.get("split") != entry.get("paper_split"):
            out.notes.append(f"{et.TASKS[task].column} on {entry['split']}")
        if entry.get("limit") is not None:
            out.notes.append(f"{et.TASKS[task].column} limit={entry['limit']}")
    return out if out.scores else None


def lm_eval_scores(path: Path, warnings: list[str]) -> dict[str, float]:
    """Task -> score from one lm-eval-harness results JSON (``acc,none`` or old ``acc`` keys).

    MMLU is the aggregate ``mmlu`` entry (the per-subject entries are ignored).
    """
    data = runfiles.read_json(path, warnings)
    results = (data or {}).get("results")
    if data is not None and "checkpoint" in data:
        warnings.append(f"{path}: an eval.py file, not lm-eval's; pass its run directory instead")
        return {}
    if not isinstance(results, dict):
        if data is not None:
            warnings.append(f"{path}: no 'results' mapping; not an lm-eval results file")
        return {}
    scores = {}
    for task, meta in et.TASKS.items():
        entry = results.get(task)
        if not isinstance(entry, dict):
            continue
        metric = meta.metric
        value = to_float(entry.get(f"{metric},none", entry.get(metric)))
        if value is not None:
            scores[task] = value
    return scores


def newest(paths: list[Path]) -> Path:
    """The newest lm-eval file: by the timestamp in its name, then by modification time."""
    return max(paths, key=lambda p: (p.name, p.stat().st_mtime))


def lm_eval_model_path(path: Path) -> str | None:
    """The ``pretrained=`` path of an lm-eval results file (what was evaluated), if recorded."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    args = (data.get("config") or {}).get("model_args") if isinstance(data, dict) else None
    if isinstance(args, dict):
        return args.get("pretrained")
    m = re.search(r"pretrained=([^,]+)", str(args or ""))
    return m.group(1) if m else None


def merge_downstream(eval_py: Downstream | None, lm_eval: dict[str, float]) -> Downstream | None:
    """eval.py scores overridden task by task by lm-eval's (made as the paper's were)."""
    out = eval_py or Downstream()
    for task, value in lm_eval.items():
        out.scores[task] = value
        out.sources[task] = "lm-eval"
    replaced = tuple(et.TASKS[t].column + " " for t in lm_eval)  # drop notes on replaced tasks
    out.notes = [n for n in out.notes if not n.startswith(replaced)]
    return out if out.scores else None


def load_run(path: Path, lm_files: list[Path], warnings: list[str]) -> Run | None:
    """Read one run directory; None (with a warning) when its config cannot be read.

    ``lm_files`` are lm-eval results files named on the command line for this run; they win
    over the ones found under ``<run>/eval``.
    """
    try:
        config = runfiles.load_config(path)
    except (OSError, yaml.YAMLError) as exc:
        warnings.append(f"{path}: config.yaml unreadable ({exc}); run skipped")
        return None
    if not isinstance(config, dict):
        warnings.append(f"{path}: config.yaml is not a mapping; run skipped")
        return None
    own: list[str] = []
    records = runfiles.read_metrics(path, own)
    summary = runfiles.read_summary(path, own)
    run = Run(path, config, len(records), eval_points(records, path, own), summary, warnings=own)
    run.conditions = read_conditions(path, records, summary)
    steps = [int(r["step"]) for r in records if isinstance(r.get("step"), int | float)]
    tokens = [to_float(r.get("tokens")) or 0.0 for r in records]
    run.steps = max(steps + [int(to_float((summary or {}).get("steps")) or 0)], default=0)
    run.tokens = max(tokens + [to_float((summary or {}).get("tokens")) or 0.0], default=0.0)
    evals = path / runfiles.EVAL
    found = sorted(evals.glob("**/results_*.json")) if evals.is_dir() else []
    lm = lm_eval_scores(newest(lm_files), own) if lm_files else {}
    if not lm and found:  # files named on the command line win over the ones found
        lm = lm_eval_scores(newest(found), own)
    run.downstream = merge_downstream(eval_py_scores(path, own), lm)
    warnings.extend(own)
    return run
