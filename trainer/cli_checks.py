"""The command line's names checked before anything slow is imported: every key, group and option
of an override is a real one, or the command ends with one line naming the closest real one.

Importing torch takes seconds, and the config's dataclasses live in modules that import it; so the
keys are read from the dataclasses' source (``ast``, never run) and the groups' options from
``configs/``. ``tests/test_cli.py`` checks that what is read here equals the real dataclasses.
Hydra composes the config afterwards and ``trainer/checks.py`` checks every value.

train.py's command line (``trainer/command_line.py``) and eval.py parse the overrides with
Hydra's parser and pass plain ``Override`` tuples: this module imports neither Hydra nor torch
(only the standard library and yaml: configs/ is read by runtime/config_files.py).
"""

from __future__ import annotations

import ast
import difflib
import functools
from typing import Any, NamedTuple

from runtime.config_files import ROOT, config_names, group_choices

GROUPS = ("model", "data", "optimizer", "schedule", "experiment")  # what a user may choose
OPEN = "open"  # a field whose keys are not checked (``Any``, ``dict``)
Schema = dict[str, Any]  # field -> nested Schema, None (a value) or OPEN


class Override(NamedTuple):
    """One command-line override: its key (``optimizer.lr``, ``model``) and, for a group, the
    options it chooses (several in a ``--multirun`` sweep)."""

    key: str
    options: tuple[str, ...] = ()
    swept: bool = False  # a --multirun sweep over several values


def stray_words(args: list[str]) -> str | None:
    """The one line for a word that is neither ``key=value`` nor a flag (nor a flag's value):
    most often the rest of a path with a space that the shell split (``out_dir=my runs/x``)."""
    for i, arg in enumerate(args):
        if "=" in arg or arg.startswith(("-", "~", "+")):
            continue
        if i and args[i - 1].startswith("-") and "=" not in args[i - 1]:
            continue  # a flag's value: --cfg job, -cn config
        before = args[i - 1] if i else ""
        hint = f" (the rest of {before}?)" if "=" in before else ""
        key = before.partition("=")[0] if "=" in before else "out_dir"
        return (f"{arg!r} is not key=value{hint}: quote a value that holds spaces, e.g. "
                f"{key}='my runs/x'")  # fmt: skip
    return None


def override_args(args: list[str]) -> list[str]:
    """The overrides among command-line ``args`` (``key=value``, ``~key``), without the flags."""
    return [a for a in args if ("=" in a or a.startswith("~")) and not a.startswith("-")]


# Hydra's kinds of sweep (``ValueType`` names) whose values can be listed before composing
ENUMERABLE_SWEEPS = ("SIMPLE_CHOICE_SWEEP", "CHOICE_SWEEP", "RANGE_SWEEP")


def from_parsed(parsed: list[Any]) -> list[Override]:
    """Hydra's parsed overrides (the entry points' ``OverridesParser``) as plain ``Override``s:
    the key, the values as strings (each of a sweep's, or the one value), whether it sweeps."""
    return [Override(o.key_or_group, _values(o), o.is_sweep_override()) for o in parsed]


def _values(override: Any) -> tuple[str, ...]:
    if override.is_sweep_override():  # a glob or interval is left to Hydra: not enumerable here
        listed = override.value_type.name in ENUMERABLE_SWEEPS
        return tuple(override.sweep_string_iterator()) if listed else ()
    value = override.value()
    return () if value is None else (value if isinstance(value, str) else str(value),)


# --- the dataclasses, read from their source -----------------------------------------------------


@functools.cache
def _module(name: str) -> tuple[dict[str, ast.ClassDef], dict[str, tuple[str, str]]]:
    """The classes of the project module ``name`` and its ``from X import Y`` names."""
    path = ROOT / (name.replace(".", "/") + ".py")
    if not path.is_file():
        path = ROOT / name.replace(".", "/") / "__init__.py"
    tree = ast.parse(path.read_text())
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    imports = {
        (a.asname or a.name): (n.module, a.name)
        for n in tree.body
        if isinstance(n, ast.ImportFrom) and n.module and not n.level
        for a in n.names
    }
    return classes, imports


def _is_project(module: str) -> bool:
    base = ROOT / module.replace(".", "/")
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _find(module: str, name: str) -> tuple[str, ast.ClassDef] | None:
    """Where the class ``name`` seen from ``module`` is defined (following re-exports)."""
    classes, imports = _module(module)
    if name in classes:
        return module, classes[name]
    if name in imports and _is_project(imports[name][0]):
        return _find(*imports[name])
    return None


def _is_dataclass(cls: ast.ClassDef) -> bool:
    for d in cls.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        if (d.id if isinstance(d, ast.Name) else getattr(d, "attr", "")) == "dataclass":
            return True
    return False


def _field_schema(module: str, annotation: ast.expr) -> Any:
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval").body
    names = {n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)}
    if names & {"Any", "dict", "Dict"}:
        return OPEN
    found = [f for f in (_find(module, n) for n in sorted(names)) if f and _is_dataclass(f[1])]
    return fields(found[0][0], found[0][1].name) if len(found) == 1 else None


@functools.cache
def fields(module: str, name: str) -> Schema:
    """The fields of the dataclass ``name`` of ``module`` (bases' first), nested dataclasses as
    their own Schema."""
    found = _find(module, name)
    assert found is not None and _is_dataclass(found[1]), f"{module}.{name} is not a dataclass"
    where, cls = found
    schema: Schema = {}
    for base in cls.bases:
        if isinstance(base, ast.Name) and (b := _find(where, base.id)) and _is_dataclass(b[1]):
            schema.update(fields(b[0], b[1].name))
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if "ClassVar" not in ast.unparse(node.annotation):
                schema[node.target.id] = _field_schema(where, node.annotation)
    return schema


@functools.cache
def optimizer_fields() -> dict[str, Schema]:
    """Every registered optimizer's config fields, by name: the ``register("name", Config, ...)``
    calls of ``optim/``."""
    found = {}
    for path in sorted((ROOT / "optim").glob("*.py")):
        module = f"optim.{path.stem}"
        for node in ast.walk(ast.parse(path.read_text())):
            func = getattr(node, "func", None)
            if isinstance(node, ast.Call) and getattr(func, "id", "") == "register":
                args = node.args
                if (
                    len(args) >= 2
                    and isinstance(args[0], ast.Constant)
                    and isinstance(args[1], ast.Name)
                ):
                    found[args[0].value] = fields(module, args[1].id)
    return found


# --- the groups and their options ----------------------------------------------------------------


@functools.cache
def group_options(group: str) -> tuple[str, ...]:
    """The options of a config group: its YAML files under ``configs/<group>/``, without the
    suffix (``owt/small-adamw``)."""
    return tuple(config_names(group))


def chosen_options(overrides: list[Override], group: str) -> list[str]:
    """The options of ``group`` a command line runs with: its own, else its experiments', else
    configs/config.yaml's default."""
    own = [o.options for o in overrides if o.key == group]
    if own:  # none when Hydra alone can list them (a glob): its keys are checked after composing
        return list(own[-1])
    default = group_choices("config")
    experiments = [o.options for o in overrides if o.key == "experiment"]
    chosen = []
    for experiment in experiments[-1] if experiments else [default.get("experiment")]:
        known = experiment is not None and experiment in group_options("experiment")
        choice = group_choices(f"experiment/{experiment}").get(group) if known else None
        chosen.append(str(choice) if choice is not None else default[group])
    return sorted(set(chosen))


# --- the checks ----------------------------------------------------------------------------------


def _closest(word: str, candidates: Any) -> str | None:
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return close[0] if close else None


def _unknown_in(
    parts: list[str], schema: Schema, optimizers: dict[str, Schema], prefix: str = ""
) -> str | None:
    """``parts`` (a dotted key) checked against ``schema`` (``optimizer.*`` against each chosen
    optimizer's fields): the key with the closest valid one when unknown, else None."""
    node: Any = schema
    for i, part in enumerate(parts):
        if node is OPEN:
            return None
        if not isinstance(node, dict) or part not in node:
            full, close = prefix + ".".join(parts), _closest(part, node or {})
            if close is None:
                return full
            return (
                f"{full} (did you mean {prefix}{'.'.join([*parts[:i], close, *parts[i + 1 :]])}?)"
            )
        node = node[part]
        if not prefix and i == 0 and part == "optimizer" and optimizers and len(parts) > 1:
            for name, opt in optimizers.items():
                bad = _unknown_in(parts[1:], opt, {}, "optimizer.")
                if bad is not None:
                    return bad if "(" in bad else f"{bad} ({_owners(parts[1], name)})"
            return None
    return None


def _owners(key: str, chosen: str) -> str:
    """Which optimizers have a key like ``key``, for the message about ``chosen``'s lack of it."""
    have = {n: _closest(key, f) for n, f in optimizer_fields().items()}
    have = {n: k for n, k in have.items() if k}
    if not have:
        return f"optimizer={chosen} has no such key"
    names = ", ".join(sorted(have)[:4]) + (", ..." if len(have) > 4 else "")
    return (f"optimizer={chosen} has no such key; {names} "
            f"{'has' if len(have) == 1 else 'have'} {sorted(set(have.values()))[0]}")  # fmt: skip


def unknown_overrides(
    overrides: list[Override], schema: Schema, *, groups: tuple[str, ...] = (),
    optimizers: dict[str, Schema] | None = None,
) -> list[str]:  # fmt: skip
    """The one-line reasons why ``overrides`` name no real key, group or option."""
    problems = []
    keys = {**dict.fromkeys(groups), **schema}
    for o in overrides:
        root = o.key.split(".")[0].split("/")[0]
        if root == "hydra":
            continue  # Hydra's own settings: Hydra checks them
        if o.key in groups:
            for option in o.options:
                valid = group_options(o.key)
                if option not in valid and option != "null":
                    close = _closest(option, valid)
                    hint = f" (did you mean {o.key}={close}?)" if close else ""
                    problems.append(f"unknown {o.key} {option!r}{hint}; valid: {', '.join(valid)}")
            continue
        if "/" in o.key:
            close = _closest(o.key, groups)
            hint = f" (did you mean {close}?)" if close else ""
            problems.append(f"unknown config group {o.key}{hint}; groups: {', '.join(groups)}")
            continue
        if replaced := replaced_key(o.key):
            problems.append(replaced)
            continue
        bad = _unknown_in(o.key.split("."), keys, optimizers or {})
        if bad is not None:
            problems.append(f"unknown config key {bad}")
    return problems


# Keys an earlier version had, each refused with the key that replaced it (docs/optim-engine.md)
REPLACED = dict.fromkeys(("optimizer.fused", "optimizer.foreach"), "optimizer.implementation")


def replaced_key(key: str) -> str | None:
    """The one line for an earlier version's key (``optimizer.fused``), else None."""
    key = key.lstrip("+~")
    if key not in REPLACED:
        return None
    return f"{key} was replaced by {REPLACED[key]} (docs/optim-engine.md)"


def check_train_overrides(overrides: list[Override]) -> None:
    """ValueError with one line if an override of train.py names no real key, group or option."""
    optimizers = optimizer_fields()
    chosen = {n: optimizers[n] for n in chosen_options(overrides, "optimizer") if n in optimizers}
    schema = fields("trainer.config", "TrainConfig")
    _raise(unknown_overrides(overrides, schema, groups=GROUPS, optimizers=chosen), "train.py")


def check_eval_overrides(overrides: list[Override]) -> None:
    """ValueError with one line if an override of eval.py names no real key."""
    _raise(unknown_overrides(overrides, fields("evals.config", "EvalConfig")), "eval.py")


def _raise(problems: list[str], program: str) -> None:
    if problems:
        keys = any(p.startswith("unknown config key") for p in problems)
        tail = f"; `python {program} --cfg job` lists the keys" if keys else ""
        raise ValueError("; ".join(problems) + tail)


# Path keys of the entry points. A run or sweep directory's name holds its overrides
# (runs/NAME_optimizer.lr=0.003,seed=2): '=' and ',' that Hydra's override grammar refuses, or
# reads as a sweep, in an unquoted value. Such a value is quoted for the user.
TRAIN_PATH_KEYS = ("resume", "out_dir", "data.dir")
EVAL_PATH_KEYS = ("checkpoint", "out", "val_data_dir", "data_dir")


def quote_paths(args: list[str], keys: tuple[str, ...], sweepable: tuple[str, ...] = ()
                ) -> list[str]:  # fmt: skip
    """``args`` with each ``key=value`` of ``keys`` whose value holds ``=`` or a space (or ``,``,
    unless the key is in ``sweepable``: there a comma means a sweep) quoted for Hydra, so that
    ``checkpoint=runs/x_optimizer.lr=0.003/seed=1337`` names that directory."""
    out = []
    for arg in args:
        key, sep, value = arg.partition("=")
        special = "=" in value or " " in value or ("," in value and key not in sweepable)
        if sep and key in keys and special and value[:1] not in "'\"" and "'" not in value:
            arg = f"{key}='{value}'"
        out.append(arg)
    return out
