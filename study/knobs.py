"""The knobs a study tunes: one set, with one name and one meaning for every optimizer.

| knob | meaning | config key it sets | lattice |
|---|---|---|---|
| ``lr`` | peak lr of the block matrices' update | ``optimizer.lr`` | x2 from 1e-3 |
| ``aux_lr`` | peak lr of every other parameter (token embedding = tied head, an untied head, positions, norm gains, biases), whatever update they get | ``optimizer.aux_lr`` | x2 from 1e-3 |
| ``wd`` | decoupled weight decay of the block matrices | ``optimizer.weight_decay`` | x sqrt(10) from 0.1 (0.1, 0.0316, 0.01, ...) |
| ``beta2`` | the second-moment EMA (``betas[1]``); the Muon family has none on its matrices, and its own equivalent, the one EMA of its matrix update, is ``momentum`` | ``optimizer.betas`` (index 1) or ``optimizer.momentum`` | 1 - beta on x sqrt(5) from 0.01 (0.95, 0.9776, 0.99, 0.9955, 0.998) |
| ``warmup`` | the warmup as a fraction of the run's steps | ``schedule.warmup_steps`` | x2 from 0.1, at most 0.5 |

Every value of a knob lies on one lattice, ``anchor * factor**k`` at 4 significant digits (for
``beta2``, ``1 - beta``), so a value reached from any center has one spelling in run directories
and results.csv; a center off the lattice snaps to its nearest point. ``need`` is the number of
worse values a best must have on each side on the first selection seed (the lr's landscape has a
cliff, so two; one elsewhere); the final choice is bracketed by the mean over every selection
seed (study/tuner.py).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

KNOB_ORDER = ("lr", "aux_lr", "wd", "beta2", "warmup")  # coordinate descent's order
DEFAULT_KNOBS = list(KNOB_ORDER)


@dataclass(frozen=True)
class Knob:
    name: str
    anchor: float  # the lattice: anchor * factor**k
    factor: float
    need: int  # worse values each side of the best on the first selection seed
    lo: float  # the lattice's bounds (a value outside is never run)
    hi: float
    one_minus: bool = False  # the lattice is on 1 - value (a beta)

    def value(self, k: int) -> float:
        x = float(f"{self.anchor * self.factor**k:.4g}")
        return float(f"{1.0 - x:.8g}") if self.one_minus else x

    def index(self, value: float) -> int:
        """The lattice point nearest ``value``."""
        x = 1.0 - value if self.one_minus else value
        if not x > 0:
            raise ValueError(f"knob {self.name}: {value} is not on its lattice (positive"
                             f"{' 1 - value' if self.one_minus else ''} needed)")  # fmt: skip
        return round(math.log(x / self.anchor, self.factor))

    def allowed(self, k: int) -> bool:
        return self.lo <= self.value(k) <= self.hi

    def snap(self, value: float) -> float:
        return self.value(self.index(value))


KNOBS = {
    "lr": Knob("lr", 1e-3, 2.0, 2, 1e-6, 64.0),
    "aux_lr": Knob("aux_lr", 1e-3, 2.0, 1, 1e-6, 64.0),
    "wd": Knob("wd", 0.1, math.sqrt(10.0), 1, 1e-5, 10.0),
    "beta2": Knob("beta2", 0.01, math.sqrt(5.0), 1, 0.5, 0.9999, one_minus=True),
    "warmup": Knob("warmup", 0.1, 2.0, 1, 0.005, 0.5),
}


def generic(key: str) -> Knob:
    """A tuned key that is not one of the knobs (a variant's ``adamw:eps=tuned``): x2 lattice."""
    return Knob(key, 1e-3, 2.0, 1, 0.0, math.inf)


def lattice(key: str) -> Knob:
    return KNOBS.get(key) or generic(key)


def _config_defaults(optimizer: str) -> object:
    from optim import get_spec

    return get_spec(optimizer).config_cls()


def beta_field(optimizer: str) -> str:
    """Which config field the ``beta2`` knob sets for ``optimizer`` (a registered name)."""
    fields = {f.name for f in dataclasses.fields(_config_defaults(optimizer))}
    if "betas" in fields:
        return "betas"
    if "momentum" in fields:
        return "momentum"
    raise ValueError(f"optimizer {optimizer!r} has neither betas nor momentum: no beta2 knob")


def default(optimizer: str, knob: str, lr_center: float) -> float:
    """Where a knob's search starts when nothing says otherwise: the optimizer's own default
    (snapped to the lattice); ``aux_lr`` at the lr's center; a weight decay of 0 at 0.01 (a
    lattice has no 0; its lowest points decay nothing measurable)."""
    cfg = _config_defaults(optimizer)
    if knob == "lr":
        return KNOBS["lr"].snap(lr_center)
    if knob == "aux_lr":
        return KNOBS["aux_lr"].snap(lr_center)
    if knob == "wd":
        wd = float(cfg.weight_decay)
        return KNOBS["wd"].snap(wd if wd > 0 else 0.01)
    if knob == "beta2":
        field = beta_field(optimizer)
        value = cfg.betas[1] if field == "betas" else cfg.momentum
        return KNOBS["beta2"].snap(float(value))
    if knob == "warmup":
        return KNOBS["warmup"].snap(0.1)
    raise ValueError(f"unknown knob {knob!r}; knobs: {', '.join(KNOB_ORDER)}")


def overrides(optimizer: str, knob: str, value: float, steps: int) -> list[str]:
    """The train.py overrides that set ``knob`` to ``value`` for ``optimizer`` (registered
    name) in a run of ``steps`` steps. A key that is not a knob is an optimizer option."""
    if knob == "lr":
        return [f"optimizer.lr={value!r}"]
    if knob == "aux_lr":
        return [f"optimizer.aux_lr={value!r}"]
    if knob == "wd":
        return [f"optimizer.weight_decay={value!r}"]
    if knob == "beta2":
        field = beta_field(optimizer)
        if field == "momentum":
            return [f"optimizer.momentum={value!r}"]
        betas = list(_config_defaults(optimizer).betas)
        betas[1] = value
        return [f"optimizer.betas=[{','.join(repr(float(b)) for b in betas)}]"]
    if knob == "warmup":
        return [f"schedule.warmup_steps={max(1, round(value * steps))}"]
    return [f"optimizer.{knob}={value!r}"]


def ran_values(optimizer: str, config: dict) -> dict[str, float]:
    """The value of every knob that a run's resolved config (its config.yaml) ran with, tuned or
    carried: what results.csv records (``optimizer`` the registered name). ``warmup`` is the
    lattice fraction that gives the run's warmup steps (the plain fraction if none does)."""
    opt, steps = config["optimizer"], int(config["max_steps"])
    out = {"lr": float(opt["lr"])}
    if opt.get("aux_lr") is not None:
        out["aux_lr"] = float(opt["aux_lr"])
    if opt.get("weight_decay") is not None:
        out["wd"] = float(opt["weight_decay"])
    try:
        field = beta_field(optimizer)
        beta = opt[field][1] if field == "betas" else opt[field]
        out["beta2"] = float(beta)
    except (ValueError, KeyError, TypeError, IndexError):
        pass  # no second-moment knob for this optimizer
    warmup = int(config["schedule"]["warmup_steps"])
    if warmup > 0:
        snapped = KNOBS["warmup"].snap(warmup / steps)
        out["warmup"] = (
            snapped if max(1, round(snapped * steps)) == warmup else float(f"{warmup / steps:.4g}")
        )
    return out
