"""Where each cell of the study stands, read from its run directories and its ledger (so the
study resumes, on a fresh clone too: study/ledger.py):
the tuning (study/tuner.py: coordinate descent to the joint optimum, chosen by the mean over the
selection seeds), then the evaluation seeds at the chosen values, and, for the main budgets, the
final lr line's finalists on the evaluation seeds too (the swap that measures selection error).
A baseline budget (AdamW at 2x, 4x) tunes its lrs from its main budget's choice and carries the
other knobs from there.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from study import ledger
from study.knobs import overrides as knob_overrides
from study.plan import FIXED, Cell, Plan, block_params, budget_steps
from study.runner import Run, result
from study.tuner import Tuned, final_line, tune
from study.variant import Variant

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
    flags: dict[str, str] = field(default_factory=dict)  # key -> bracketed|capped|edge|fixed
    pending: list[Run] = field(default_factory=list)
    ahead: list[Run] = field(default_factory=list)  # the runs likely next (study/tuner.py)
    done: bool = False
    tuned: Tuned | None = None  # the tuning's lines and passes (None: untuned or waiting)
    swap_values: list[float] = field(default_factory=list)  # lr finalists on the eval seeds


class Study:
    """The plan plus the state read from disk."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.params = {m: block_params(m) for m in plan.models}
        self.states: dict[Cell, CellState] = {}
        self.ledger = ledger.load(plan.out)

    def loss(self, run: Run) -> float | None:
        """A run's end-of-run loss (inf: diverged; None: not finished), from its directory or,
        where that is gone, from the study's ledger."""
        loss = finished_loss(run.out_dir, run.max_steps)
        if loss is None:
            loss = self.ledger.loss(self.run_id(run.out_dir), run.max_steps)
        return loss

    def run_id(self, run_dir: Path) -> str:
        """The run's id in the ledger: its directory relative to the study's folder."""
        return run_dir.relative_to(self.plan.out).as_posix()

    def steps(self, cell: Cell) -> int:
        return budget_steps(self.params[cell.model], cell.budget, self.batch_tokens(cell))

    def batch_tokens(self, cell: Cell) -> int:
        """The cell's global batch: the study's, or a variant's ``batch_tokens=N``."""
        own = Variant.parse(cell.optimizer).batch_tokens
        return self.plan.batch_tokens if own is None else own

    def overrides(self, cell: Cell, values: dict[str, float], seed: int) -> tuple[str, ...]:
        """Every override of one run of ``cell`` at ``values`` (tuned and fixed knobs)."""
        steps, plan = self.steps(cell), self.plan
        variant = Variant.parse(cell.optimizer)
        base, options, set_by_variant = variant.base, variant.overrides, variant.override_keys
        knob_args: list[str] = []
        for k, v in values.items():
            knob_args += [a for a in knob_overrides(base, k, v, steps)
                          if a.split("=", 1)[0] not in set_by_variant]  # fmt: skip
        if "warmup" not in values and "schedule.warmup_steps" not in set_by_variant:
            knob_args.append(f"schedule.warmup_steps={max(1, round(plan.warmup_frac * steps))}")
        every = max(1, steps // max(1, plan.evals)) if plan.evals > 1 else 0
        head = (
            "experiment=study",
            f"model={cell.model}",
            f"optimizer={base}",
            *FIXED.get(base, []),
            *[o for o in options if not o.startswith("batch_tokens=")],
        )
        tail = (
            f"max_steps={steps}", f"batch_tokens={self.batch_tokens(cell)}",
            f"eval_every={every}", *knob_args, f"seed={seed}", *plan.train_overrides,
        )  # fmt: skip
        later = {a.split("=", 1)[0]: a for a in tail if a.split("=", 1)[0] in set_by_variant}
        mine = {
            a.split("=", 1)[0]: a for a in (*options, f"batch_tokens={self.batch_tokens(cell)}")
        }
        clash = [a for key, a in later.items() if a != mine.get(key)]
        if clash:  # Hydra takes the last value: the variant's would be silently replaced
            raise ValueError(f"{cell.optimizer}: {' '.join(clash)} (the study's overrides) would "
                             "replace the variant's own value; drop it from the part's overrides "
                             "or from the variant")  # fmt: skip
        return (*head, *tail)

    def run(self, cell: Cell, role: str, values: dict[str, float], seed: int) -> Run:
        keyed = {k: values[k] for k in self.plan.keys(cell)}
        out_dir = self.plan.run_dir(cell, role, keyed, seed)
        return Run(self.overrides(cell, values, seed), out_dir, self.steps(cell))

    def start(self, cell: Cell) -> dict[str, float] | None:
        """Every knob's starting or fixed value; a baseline budget's carried knobs come from
        its main budget's choice (None while that is not chosen yet)."""
        plan = self.plan
        keys = plan.keys(cell)
        values = {**plan.fixed_knobs(cell), **{k: plan.center(cell, k) for k in keys}}
        if plan.is_main(cell):
            return values
        main = min(plan.budgets, key=lambda b: abs(math.log(b / cell.budget)))
        ref = self.states.get(Cell(cell.optimizer, cell.model, main))
        if ref is None or not ref.done:
            return None
        return {**values, **ref.chosen}  # tuned keys start there, the rest are carried

    def update(self, cell: Cell) -> CellState:
        """Read ``cell``'s runs; its next runs (``pending``) or its chosen values."""
        plan = self.plan
        state = CellState(cell, self.steps(cell))
        self.states[cell] = state
        start = self.start(cell)
        if start is None:  # a baseline budget waits for its main budget's choice
            return state
        keys = plan.keys(cell)

        def loss_of(values: dict, seed: int) -> float | None:
            return self.loss(self.run(cell, "select", values, seed))

        if cell.optimizer in plan.untuned:  # an ablation at given values: no selection runs
            state.chosen, state.flags = dict(start), dict.fromkeys(keys, "fixed")
        else:
            tuned = tune(keys, start, plan.select_seeds, loss_of, finalists=plan.finalists,
                         cap=plan.cap, max_passes=plan.max_passes)  # fmt: skip
            state.tuned = tuned
            if tuned.pending:
                state.pending = [self.run(cell, "select", v, s) for v, s in tuned.pending]
                state.ahead = [self.run(cell, "select", v, s) for v, s in tuned.ahead]
                if tuned.likely is not None:  # then the evaluation seeds at the likely choice
                    runs = [self.run(cell, "eval", tuned.likely, s) for s in plan.eval_seeds]
                    state.ahead += [r for r in runs if self.loss(r) is None]
                return state
            state.chosen, state.flags = tuned.chosen, dict(tuned.flags)
            if not tuned.converged:
                state.flags["passes"] = "capped"
        points = [state.chosen]
        if plan.swap and plan.is_main(cell) and state.tuned is not None and "lr" in keys:
            line = final_line(state.tuned, "lr")
            state.swap_values = sorted(line.means) if line else []
            points += [{**state.chosen, "lr": v} for v in state.swap_values
                       if not math.isclose(v, state.chosen["lr"])]  # fmt: skip
            if not state.tuned.converged:
                # capped: the last lr line ran before the other keys last moved, so its finalists
                # run once more on the selection seeds at the final values (the swap reads both
                # seed sets there, and the report says whether the lr is still the best there)
                for v in state.swap_values:
                    for seed in plan.select_seeds:
                        r = self.run(cell, "select", {**state.chosen, "lr": v}, seed)
                        if self.loss(r) is None:
                            state.pending.append(r)
        for values in points:
            for seed in plan.eval_seeds:
                r = self.run(cell, "eval", values, seed)
                if self.loss(r) is None:
                    state.pending.append(r)
        state.done = not state.pending
        return state


def mark_failed(runs: list[Run]) -> None:
    """Runs of a failed command that started and did not finish: recorded as diverged, so the
    grid moves on instead of running them forever."""
    for r in runs:
        if r.out_dir.is_dir() and result(r.out_dir, r.max_steps) is None:
            (r.out_dir / FAILED).write_text(json.dumps({"reason": "its command failed"}) + "\n")
