"""The typed rule of an optimizer: what the core (optim/core.py) does to a param group's tensors.

A rule names the four pieces of the MARS design (docs/design.md, "The optimizer core"):

- ``variance_reduction``: the MARS correction ``c = g + gamma*beta1/(1-beta1) * (g - g_ref)`` and
  its clip, or None (``c = g``);
- ``momentum``: a form of optim/momentum.py (``ema``, ``ema-lerp``, ``mars-m``, ``heavy-ball``,
  ``one-buffer``, ``lion``);
- ``preconditioner``: a registered preconditioner (optim/preconditioners.py) and its typed
  ``Options``;
- ``split_1d`` (routing): MARS's official rule for tensors that are not 2-D (AdamW on the raw
  gradient with ``betas_1d``, ``weight_decay_1d`` and lr ``lr * lr_1d_factor``), or None.

Param groups stay flat dicts (torch's contract: a schedule sets ``group["lr"]``, a checkpoint
stores the groups), so ``Rule.group_keys()`` spells the rule as group keys; the core checks every
group's keys and values when it is added (an unknown or misspelt key is an error).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from optim.options import check_fields
from optim.preconditioners import PRECONDITIONERS, Options


@dataclass(frozen=True)
class VarianceReduction:
    """The MARS correction: ``gamma``, the clip scope and the first step's convention."""

    gamma: float = 0.025
    clip: str = "tensor"  # tensor (official) | global (levanter) | none
    first_step: str = "zero"  # zero: g_ref = 0 (official) | plain: c_1 = g_1

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class Split1D:
    """MARS's non-2-D tensors: AdamW with these values (``optimize_1d=False``, the official)."""

    lr_1d_factor: float
    betas_1d: tuple[float, float] = (0.9, 0.95)
    weight_decay_1d: float = 0.1

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class Rule:
    """One optimizer's update rule (module docstring)."""

    momentum: str
    preconditioner: str
    options: Options | None = None  # the preconditioner's Options (None: its defaults)
    variance_reduction: VarianceReduction | None = None
    split_1d: Split1D | None = None

    def __post_init__(self) -> None:
        if self.preconditioner not in PRECONDITIONERS:
            raise ValueError(
                f"unknown preconditioner {self.preconditioner!r}; registered: "
                f"{sorted(PRECONDITIONERS)} (optim.register_preconditioner adds one)"
            )
        expected = PRECONDITIONERS[self.preconditioner].Options
        if self.options is not None and not isinstance(self.options, expected):
            raise TypeError(f"{self.preconditioner!r} takes {expected.__name__}, "
                            f"got {type(self.options).__name__}")  # fmt: skip

    def group_keys(self) -> dict:
        """The rule as param-group keys (what the core reads)."""
        options = self.options or PRECONDITIONERS[self.preconditioner].Options()
        vr, split = self.variance_reduction, self.split_1d
        return {
            "momentum_form": self.momentum,
            "preconditioner": self.preconditioner,
            "variance_reduction": vr is not None,
            **(asdict(vr) if vr else {}),
            "split_1d": split is not None,
            **(asdict(split) if split else {}),
            **options.group_keys(),
        }
