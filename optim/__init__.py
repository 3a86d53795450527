"""Everything that maps gradients to updates: optimizers, their registry, routing and schedules.

Depends on torch only, so it can be copied into another codebase. ``MARS``, ``MARS_M``,
``MARS_M_Efficient`` and ``Moonlight`` accept the official AGI-Arena/MARS constructors' keywords;
they, ``Muon`` and ``Lion`` are thin constructors over one core (optim/core.py: the MARS
correction, a momentum form of optim/momentum.py, a preconditioner of optim/preconditioners.py),
each stating its typed rule (optim/rule.py). Every option has one validator (optim/options.py).
A new MARS instance, a new correction or a schedule on gamma: docs/adding-an-optimizer.md.
"""

from optim import adamw as _adamw  # noqa: F401  (registers "adamw")
from optim import baselines as _baselines  # noqa: F401  (soap, ademamix, normuon, schedule-free)
from optim import builders as _builders  # noqa: F401  (registers the rest)
from optim.adamw import AdamWConfig
from optim.builders import MarsAdamWConfig, MarsConfig, build_mars
from optim.core import VarianceReduced
from optim.groups import classify_parameters, decay_groups, split_aux
from optim.lion import Lion
from optim.mars import MARS
from optim.muon import MARS_M, MARS_M_Efficient, Moonlight, Muon, MuonFamily
from optim.options import validator
from optim.preconditioners import Options, Preconditioner, Step, register_preconditioner
from optim.reference import reference_pass
from optim.registry import available, build_optimizer, get_spec, register
from optim.rule import Rule, VarianceReduction
from optim.schedulefree import AdamWScheduleFree, eval_weights, train_weights
from optim.schedules import ScheduleConfig, apply_schedule, lr_at, set_initial_lr

__all__ = [
    "AdamWScheduleFree",
    "eval_weights",
    "train_weights",
    "MARS",
    "MARS_M",
    "AdamWConfig",
    "MarsAdamWConfig",
    "MarsConfig",
    "Options",
    "Preconditioner",
    "Rule",
    "Step",
    "VarianceReduction",
    "build_mars",
    "register_preconditioner",
    "validator",
    "Lion",
    "MARS_M_Efficient",
    "Moonlight",
    "Muon",
    "MuonFamily",
    "ScheduleConfig",
    "VarianceReduced",
    "apply_schedule",
    "available",
    "build_optimizer",
    "classify_parameters",
    "decay_groups",
    "get_spec",
    "lr_at",
    "reference_pass",
    "register",
    "set_initial_lr",
    "split_aux",
]
