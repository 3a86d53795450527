"""Everything that maps gradients to updates: optimizers, their registry, routing and schedules.

Depends on torch only, so it can be copied into another codebase. ``MARS``, ``MARS_M``,
``MARS_M_Efficient`` and ``Moonlight`` accept the official AGI-Arena/MARS constructors' keywords;
they, ``Muon`` and ``Lion`` are thin constructors over one core (optim/core.py: the MARS
correction, a momentum form of optim/momentum.py, a preconditioner of optim/preconditioners.py),
each stating its typed rule (optim/rule.py). Every option has one validator (optim/options.py);
each registered optimizer's typed config (an ``OptimizerConfig``: its defaults are the papers'
values) sits beside its class (``MarsConfig`` and the MARS family in optim/mars.py, ``MuonConfig``
and ``NorMuonConfig`` in optim/muon.py, ``MoonlightConfig`` and the MARS-M configs in
optim/moonlight.py, ``SoapConfig`` and ``AdEMAMixConfig`` in optim/plain.py, ...).
A new MARS instance, a new correction or a schedule on gamma: docs/adding-an-optimizer.md.
"""

# Each module registers its optimizers: the typed config beside the class or rule it configures
# (the preconditioner modules, soap, ademamix and normuon, stay below the core).
from optim import plain as _plain  # noqa: F401  (soap, ademamix)
from optim.adamw import AdamWConfig
from optim.core import VarianceReduced
from optim.groups import classify_parameters, decay_groups, split_aux
from optim.lion import Lion, LionConfig
from optim.mars import (
    MARS,
    MarsAdamWConfig,
    MarsConfig,
    MarsLionConfig,
    MarsShampooConfig,
    build_mars,
)
from optim.moonlight import (
    MARS_M,
    MARS_M_Efficient,
    MarsMConfig,
    MarsMEfficientConfig,
    Moonlight,
    MoonlightConfig,
)
from optim.muon import Muon, MuonConfig, MuonFamily, NorMuonConfig
from optim.options import OptimizerConfig, config_kwargs, validator
from optim.preconditioners import Options, Preconditioner, Step, register_preconditioner
from optim.reference import reference_pass
from optim.registry import available, build_optimizer, get_spec, register
from optim.rule import Rule, VarianceReduction
from optim.schedulefree import (
    AdamWScheduleFree,
    AdamWScheduleFreeConfig,
    eval_weights,
    train_weights,
)
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
    "OptimizerConfig",
    "config_kwargs",
    "LionConfig",
    "MarsLionConfig",
    "MarsShampooConfig",
    "MarsMConfig",
    "MarsMEfficientConfig",
    "MoonlightConfig",
    "MuonConfig",
    "NorMuonConfig",
    "AdamWScheduleFreeConfig",
]
