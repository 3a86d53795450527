"""Conformance kit for MARS ports: trajectories of the official optimizers and a checker.

``vectors/`` holds, per official optimizer and mode, the weights after every step of a run of
the OFFICIAL code (AGI-Arena/MARS, the commit in ``vectors/manifest.json``) on fixed tensors and
seeded gradients; ``generate.py`` wrote them. ``python -m optim.conformance MODULE:NAME`` replays
them through an implementation and prints PASS or the first step and tensor that leaves
tolerance. Foreign signatures plug in through a hook ``make(params, settings)`` (adapters.py;
worked examples in examples.py); ``mutants.py`` holds wrong variants the kit must catch.
docs/conformance.md is the guide. Depends on torch only.
"""

from optim.conformance.adapters import Driver, TorchDriver, make_dropin
from optim.conformance.runner import Result, check, for_class, manifest, report, run_vector, select

__all__ = [
    "Driver",
    "Result",
    "TorchDriver",
    "check",
    "for_class",
    "make_dropin",
    "manifest",
    "report",
    "run_vector",
    "select",
]
