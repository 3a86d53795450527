"""Where each cell of the study stands, read from its run directories (so the study resumes):
the tuning's coordinate descent on the selection seed, then the evaluation seeds.

Per cell, the tuned keys are searched one after the other (the lr first), each on its bracketing
grid (study/grid.py) with the other keys at their chosen value (earlier keys) or their starting
value (later ones); then every evaluation seed runs at the chosen values.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from study import grid
from study.plan import FIXED, Cell, Plan, block_params, budget_steps, split_variant
from study.runner import Run, result, run_name

FAILED = "study_failed.json"  # written into a run that a failed command left unfinished


def lookup(config: dict, dotted: str) -> object:
    for part in dotted.split("."):
        config = config[part]
    return config


def finished_loss(run_dir: Path, max_steps: int) -> float | None:
    """The run's end-of-run validation loss; inf for a diverged or failed run; None while it is
    unfinished."""
    if (run_dir / FAILED).is_file():
        return math.inf
    summary = result(run_dir, max_steps)
    if summary is None:
        return None
    loss = summary.get("final_val_loss")
    return math.inf if loss is None or not math.isfinite(loss) else float(loss)


@dataclass
class CellState:
    cell: Cell
    max_steps: int
    chosen: dict[str, float] = field(default_factory=dict)
    flags: dict[str, str] = field(default_factory=dict)  # key -> "bracketed" | "capped"
    pending: list[Run] = field(default_factory=list)
    done: bool = False


def _select_results(role_dir: Path, key: str, others: dict, max_steps: int) -> tuple[dict, list]:
    """``{value of key: loss}`` of the finished selection runs whose other keys are ``others``,
    and the started, unfinished ones' values."""
    done, unfinished = {}, []
    for run_dir in sorted(role_dir.glob("*/config.yaml")):
        cfg = yaml.safe_load(run_dir.read_text())
        if any(not math.isclose(float(lookup(cfg, k)), v) for k, v in others.items()):
            continue
        value, loss = float(lookup(cfg, key)), finished_loss(run_dir.parent, max_steps)
        if loss is None:
            unfinished.append(value)
        else:
            done[value] = loss
    return done, unfinished


class Study:
    """The plan plus the state read from disk."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.params = {m: block_params(m) for m in plan.models}
        self.states: dict[Cell, CellState] = {}

    def fixed(self, cell: Cell, steps: int, values: dict[str, float], swept: set) -> tuple:
        warmup = max(1, round(self.plan.warmup_frac * steps))
        base, options = split_variant(cell.optimizer)
        return (
            "experiment=study", f"model={cell.model}", f"optimizer={base}",
            *FIXED.get(base, []), *options, f"max_steps={steps}",
            f"batch_tokens={self.plan.batch_tokens}", f"schedule.warmup_steps={warmup}",
            *(f"{k}={v!r}" for k, v in values.items() if k not in swept), *self.plan.extra,
        )  # fmt: skip

    def center(self, cell: Cell, key: str) -> float:
        """The grid's starting value: a reference budget starts at the main budget's choice."""
        if cell.budget not in self.plan.budgets:
            main = min(self.plan.budgets, key=lambda b: abs(math.log(b / cell.budget)))
            state = self.states.get(Cell(cell.optimizer, cell.model, main))
            if state is not None and key in state.chosen:
                return state.chosen[key]
        return self.plan.center(cell, key)

    def update(self, cell: Cell) -> CellState:
        """Read ``cell``'s runs; its next runs (``pending``) or its chosen values."""
        plan = self.plan
        steps = budget_steps(self.params[cell.model], cell.budget, plan.batch_tokens)
        state = CellState(cell, steps)
        self.states[cell] = state
        keys = plan.keys(cell)
        if cell.budget not in plan.budgets:  # a reference budget waits for the main choice
            main = min(plan.budgets, key=lambda b: abs(math.log(b / cell.budget)))
            ref = self.states.get(Cell(cell.optimizer, cell.model, main))
            if ref is None or not all(k in ref.chosen for k in keys):
                return state
        current = {k: self.center(cell, k) for k in keys}
        select_dir = plan.cell_dir(cell) / "select"
        names = (*keys, "seed")
        if cell.optimizer in plan.untuned:  # an ablation at given values: no selection runs
            state.chosen = dict(current)
            state.flags = dict.fromkeys(keys, "fixed")
            keys = []
        for key in keys:
            others = {k: v for k, v in current.items() if k != key}
            done, unfinished = _select_results(select_dir, key, others, steps)
            values = unfinished or grid.step(done, current[key]).next
            g = grid.step(done, current[key])
            if values:
                fixed = self.fixed(cell, steps, {**current, "seed": plan.select_seed}, {key})
                for v in values:
                    full = {**current, key: v, "seed": plan.select_seed}
                    state.pending.append(Run(fixed, ((key, repr(v)),), names,
                                             select_dir / run_name(full, names), steps))  # fmt: skip
                return state
            current[key] = g.best
            state.chosen[key] = g.best
            state.flags[key] = "capped" if g.capped else "bracketed"
        eval_dir = plan.cell_dir(cell) / "eval"
        fixed = self.fixed(cell, steps, current, set())
        for seed in plan.eval_seeds:
            run_dir = eval_dir / run_name({**current, "seed": seed}, names)
            if finished_loss(run_dir, steps) is None:
                state.pending.append(Run(fixed, (("seed", str(seed)),), names, run_dir, steps))
        state.done = not state.pending
        return state


def mark_failed(runs: list[Run]) -> None:
    """Runs of a failed command that started and did not finish: recorded as diverged, so the
    grid moves on instead of running them forever."""
    for r in runs:
        if r.out_dir.is_dir() and result(r.out_dir, r.max_steps) is None:
            (r.out_dir / FAILED).write_text(json.dumps({"reason": "its command failed"}) + "\n")
