"""The one reader of configs/ outside Hydra (plain yaml): for the launcher, the benchmarks and the
command-line checks that run before Hydra.

``config_names("experiment/owt")`` lists a group's options; ``load_config("model/gpt2-xl")`` is
that file's values; ``load_config("experiment/owt/small-adamw")`` is the experiment composed the
way Hydra composes it for the keys it sets: its ``defaults`` list followed depth-first
(``/shared/small``, ``override /model: gpt2-small``, ``_self_``), the chosen group options
(``model``, ``optimizer``, ...) under their group's key, later values winning;
``group_choices(path)`` is what a file (and the files it lists) chooses for each group.
Interpolations (``${...}``) are left as text and the structured base config (``base_config``) is
skipped: train.py's typed defaults fill the keys a file does not set. Hydra itself (train.py)
composes what runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent  # the repository
CONFIGS = ROOT / "configs"
GLOBAL = "# @package _global_"
STRUCTURED = "base_config"  # train.py's typed TrainConfig, not a file


def config_names(group: str) -> list[str]:
    """The options of a config group (``model``, ``experiment/owt``, ...), sorted."""
    return sorted(p.relative_to(CONFIGS / group).with_suffix("").as_posix()
                  for p in (CONFIGS / group).rglob("*.yaml"))  # fmt: skip


def _read(path: str) -> tuple[dict, bool]:
    """(values, is the file `@package _global_`) of configs/<path>.yaml."""
    file = CONFIGS / f"{path.strip('/')}.yaml"
    if not file.is_file():
        group = Path(path.strip("/")).parent.as_posix()
        options = ", ".join(config_names(group)) if (CONFIGS / group).is_dir() else "none"
        raise ValueError(f"no config {path!r} (configs/{path}.yaml); {group}/ has: {options}")
    text = file.read_text()
    return yaml.safe_load(text) or {}, text.lstrip().startswith(GLOBAL)


def _merge(into: dict, new: dict) -> dict:
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v
    return into


def _entries(values: dict) -> list[tuple[str, str | None]]:
    """The defaults list as (kind, target): ("self", None), ("config", path), ("group:G", opt)."""
    out: list[tuple[str, str | None]] = []
    for entry in values.get("defaults", []):
        if entry == "_self_":
            out.append(("self", None))
        elif isinstance(entry, str):
            name = entry.lstrip("/")
            if not name.startswith("schema/") and name != STRUCTURED:  # train.py's dataclasses
                out.append(("config", entry))
        else:
            ((key, option),) = entry.items()
            group = key.removeprefix("override").strip().strip("/")
            if not group.startswith("hydra") and group != STRUCTURED:
                out.append((f"group:{group}", option))
    if ("self", None) not in out:
        out.append(("self", None))
    return out


def group_choices(path: str) -> dict[str, Any]:
    """The option configs/<path>.yaml chooses for each group, following the files its defaults
    list names (depth-first; later ones win): ``{"model": "gpt2-small", ...}``."""
    choices: dict[str, Any] = {}
    _choices(path, choices)
    return choices


def _choices(path: str, choices: dict[str, Any]) -> None:
    values, _ = _read(path)
    for kind, target in _entries(values):
        if kind == "config":
            _choices(_resolve(path, target), choices)
        elif kind.startswith("group:"):
            choices[kind[6:]] = target


def _resolve(parent: str, target: str) -> str:
    if target.startswith("/"):
        return target.strip("/")
    return f"{Path(parent).parent.as_posix()}/{target}".lstrip("./")


def load_config(path: str) -> dict[str, Any]:
    """configs/<path>.yaml composed with its defaults list (module docstring); ``defaults`` and
    keys starting with ``_`` dropped. Raises ValueError naming the options for a missing file."""
    choices = group_choices(path)
    out: dict[str, Any] = {}
    done: set[str] = set()

    def visit(p: str, top: bool) -> None:
        values, is_global = _read(p)
        own = {k: v for k, v in values.items() if k != "defaults" and not str(k).startswith("_")}
        for kind, target in _entries(values):
            if kind == "self":
                _merge(out, own if (top or is_global) else {})
            elif kind == "config":
                visit(_resolve(p, target), top)  # same package as the file that lists it
            elif kind[6:] not in done:
                group = kind[6:]
                done.add(group)
                option = load_config(f"{group}/{choices[group]}")
                _merge(out, option if _read(f"{group}/{choices[group]}")[1] else {group: option})

    visit(path, True)
    return out
