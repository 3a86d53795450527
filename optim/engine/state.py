"""What the engine keeps for one optimizer, as one typed object the optimizer owns.

``VarianceReduced`` and ``AdamWScheduleFree`` make theirs when built (``opt.engine_state``);
``of(opt)`` finds it (or makes it for an optimizer built another way). Nothing here is in a
state dict: it is rebuilt from the parameters and state on the first step after a load.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from optim.engine.tables import PlanCache


@dataclass
class EngineState:
    """The engine's memory of one optimizer.

    - ``cache``: the pointer tables and Newton-Schulz stacks (optim/engine/tables.py);
    - ``compiled``: the kernel variants compiled and run (a new one is compiled before a step
      writes anything);
    - ``off``: why the engine was given up (a compile failure, Triton missing), or None;
    - ``program``: the last step's launches, kept while they hold (optim/engine/steady.py),
      ``programs_built`` counting the lists built, ``keep`` False to keep none (a benchmark's
      "before");
    - ``fold``: the clip fold's kept ``(identity, plan)`` and ``fold_checked`` its coverage
      check (optim/engine/clip.py); ``sums_pending`` the last fold's sums merged with MARS's
      norm pass (``clip.Sums``), ``sums`` those of the step under way (taken with the fold's
      factor, ``_take_clip_fold``).
    """

    cache: PlanCache = field(default_factory=PlanCache)
    compiled: set = field(default_factory=set)
    off: str | None = None
    program: object | None = None
    programs_built: int = 0
    keep: bool = True
    fold: tuple | None = None
    fold_checked: tuple | None = None
    fold_params: list | None = None
    sums_pending: object | None = None
    sums: object | None = None


def of(opt) -> EngineState:
    """``opt``'s engine state (made on first use where the optimizer did not make one)."""
    state = opt.__dict__.get("engine_state")
    if state is None:
        state = opt.__dict__["engine_state"] = EngineState()
    return state
