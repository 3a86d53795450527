"""An optimizer of the study, parsed once: a registered optimizer and its variant's options.

``mars-soap:gamma=0`` is the registered ``mars-soap`` with ``optimizer.gamma=0`` (an ablation
cell); ``adamw:aux_lr=tuned`` tunes ``aux_lr`` instead of fixing it; ``mars-adamw:batch_tokens=8192``
changes a run setting (the batch, so the steps; ``warmup_steps=N`` the warmup), not an optimizer
option. A list value keeps its
commas in brackets: ``mars-adamw:betas=[0.9,0.95]``. The options keep the order they were written
in, so ``Variant.parse(name).name == name``: the name is the cell's identity in run directories,
ledgers and reports, and a reordered name would be another cell.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

TUNED = "tuned"  # a variant's value that tunes the key instead: ``adamw:aux_lr=tuned``
# Variant keys that are run settings, not optimizer options, and the train.py key each sets:
# ``mars-adamw:batch_tokens=8192`` (the batch, so the steps), ``...:warmup_steps=386`` (the warmup,
# which then is not a knob of that cell: the study neither tunes nor carries it).
RUN_KEYS = {"batch_tokens": "batch_tokens", "warmup_steps": "schedule.warmup_steps"}
_BASE = re.compile(r"[A-Za-z0-9][\w.-]*")
_KEY = re.compile(r"[A-Za-z_]\w*")
_PAIRS = re.compile(r",(?![^\[]*\])")  # a comma outside brackets separates two options
USAGE = (
    "write NAME or NAME:KEY=VALUE[,KEY=VALUE], e.g. mars-soap:gamma=0 or adamw:aux_lr=tuned "
    "(KEY an option of optimizer=NAME, batch_tokens or warmup_steps; a list value in brackets; the value "
    "tuned: the key is tuned like the lr)"
)


@dataclass(frozen=True)
class Variant:
    """A study's optimizer: ``base`` (registered) and its ``options`` as written, in order."""

    base: str
    options: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, name: str) -> Variant:
        """``"mars-adamw:gamma=0,batch_tokens=8192"`` -> its Variant; a bad spelling raises
        ValueError, one line naming the problem and the spelling to use."""
        return _parse(name)

    @property
    def name(self) -> str:
        """The name it was parsed from (``base`` alone when it has no options)."""
        if not self.options:
            return self.base
        return f"{self.base}:" + ",".join(f"{k}={v}" for k, v in self.options)

    @property
    def fixed(self) -> tuple[tuple[str, str], ...]:
        """The optimizer options it fixes: ``(("gamma", "0"),)``."""
        return tuple((k, v) for k, v in self.options if k not in RUN_KEYS and v != TUNED)

    @property
    def tuned(self) -> tuple[str, ...]:
        """The keys it tunes besides the study's knobs: ``adamw:eps=tuned`` -> ``("eps",)``."""
        return tuple(k for k, v in self.options if v == TUNED)

    @property
    def run(self) -> tuple[tuple[str, str], ...]:
        """The run settings it changes: ``(("batch_tokens", "8192"),)``."""
        return tuple((k, v) for k, v in self.options if k in RUN_KEYS)

    @property
    def overrides(self) -> list[str]:
        """Its train.py overrides, in the order written: ``optimizer.KEY=VALUE`` for an option,
        the run setting's own key for a run setting (``schedule.warmup_steps=386``); a tuned key
        has none (the tuner sets it)."""
        return [f"{RUN_KEYS.get(k, f'optimizer.{k}')}={v}" for k, v in self.options
                if v != TUNED]  # fmt: skip

    @property
    def override_keys(self) -> set[str]:
        """The config fields it sets (``optimizer.betas``, ``batch_tokens``,
        ``schedule.warmup_steps``)."""
        return {o.split("=", 1)[0] for o in self.overrides}

    @property
    def batch_tokens(self) -> int | None:
        """Its ``batch_tokens=N``, or None (the study's batch)."""
        return next((int(v) for k, v in self.run if k == "batch_tokens"), None)

    @property
    def dir_name(self) -> str:
        """Its directory name: ``mars-soap:gamma=0`` -> ``mars-soap@gamma-0``."""
        name = self.name
        for a, b in ((":", "@"), ("=", "-"), (",", "_"), ("[", ""), ("]", "")):
            name = name.replace(a, b)
        return name


@functools.lru_cache(maxsize=1024)  # a cell's name is parsed at every update of the study
def _parse(name: str) -> Variant:
    if not isinstance(name, str):
        raise ValueError(f"optimizer {name!r}: a name, {USAGE}")
    base, sep, rest = name.partition(":")
    pairs = _PAIRS.split(rest) if sep else []
    if not _BASE.fullmatch(base) or (sep and not rest):
        raise ValueError(f"optimizer {name!r}: {USAGE}")
    options: list[tuple[str, str]] = []
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not (eq and _KEY.fullmatch(key) and value) or value.count("[") != value.count("]"):
            raise ValueError(f"optimizer {name!r}: {pair!r} is not KEY=VALUE; {USAGE}")
        if any(key == k for k, _ in options):
            raise ValueError(f"optimizer {name!r}: {key} is given twice; {USAGE}")
        if key in RUN_KEYS and not (value.isdigit() and int(value) > 0):
            raise ValueError(f"optimizer {name!r}: {key}={value}: a positive whole number of "
                             f"tokens, e.g. {base}:{key}=8192 (a run setting, never tuned)")  # fmt: skip
        options.append((key, value))
    return Variant(base, tuple(options))
