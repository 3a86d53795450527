"""Checks of the composed config and of the checkpoint it resumes from, made before any file is
written, so that bad input is refused with one line that names the value and the fix.

- ``unknown_keys``: keys that the typed schema does not know. Hydra's ``+key=value`` opens the
  config to new keys; every key must still be a field of its dataclass (the optimizer's: the
  registered config class of ``optimizer.name``).
- ``check_values``: what the dataclasses' own checks cannot see alone (every float finite,
  min_lr <= lr, warmup within the run, paths usable, the device present).
- ``check_resume_source``: an explicit ``resume=PATH`` is a checkpoint of this format, of the
  configured model's shapes and of the configured optimizer; read without loading its tensors.
- ``redact``: values of secret environment variables (``*_KEY``, ``*_TOKEN``, ``*_SECRET``,
  ``*PASSWORD*``) replaced wherever the run would write them (command line, config).

docs/input-checks.md lists every check.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import types
import typing
from pathlib import Path
from typing import Any

from trainer.checkpoint import checkpoint_mismatch, read_checkpoint, resolve_resume
from trainer.cli_checks import replaced_key

SECRET_NAME = re.compile(r"(_KEY|_TOKEN|_SECRET|PASSWORD|_PASS|_PWD|_CREDENTIALS?)$|^HF_TOKEN$")
REDACTED = "<redacted>"


def _dataclass_in(tp: Any) -> type | None:
    """The dataclass named by a field's type (``X`` or ``X | None``), if any."""
    if dataclasses.is_dataclass(tp):
        return tp
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        found = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)]
        return found[0] if len(found) == 1 else None
    return None


def unknown_keys(values: dict, schema: type, schemas: dict[str, type] | None = None,
                 prefix: str = "") -> list[str]:  # fmt: skip
    """Dotted keys of ``values`` that ``schema`` (a dataclass) does not have, each with the
    closest valid key when there is one. ``schemas`` gives the dataclass of ``Any`` fields by
    their dotted key (``{"optimizer": MarsAdamWConfig}``)."""
    hints = typing.get_type_hints(schema)
    names = [f.name for f in dataclasses.fields(schema)]
    found = []
    for key, value in values.items():
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.6)
            hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
            found.append(f"{prefix}{key}{hint}")
            continue
        sub = (schemas or {}).get(prefix + key) or _dataclass_in(hints.get(key))
        if sub is not None and isinstance(value, dict):
            found += unknown_keys(value, sub, schemas, f"{prefix}{key}.")
    return found


def check_known_keys(values: dict, schema: type, schemas: dict[str, type] | None = None) -> None:
    section = values.get("optimizer")
    for key in section if isinstance(section, dict) else ():
        if replaced := replaced_key(f"optimizer.{key}"):
            raise ValueError(replaced)
    unknown = unknown_keys(values, schema, schemas)
    if unknown:
        raise ValueError(
            f"unknown config key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
            "`python train.py --cfg job` lists the valid keys"
        )


def optimizer_schema(chosen: Any, name: str, spec: Any) -> type:
    """The config class registered for ``optimizer.name`` (``spec``), which must be the class of
    the optimizer group's choice (``chosen``, read from the composed config by train.py):
    ``optimizer.name=muon`` on top of ``optimizer=adamw`` is refused."""
    if dataclasses.is_dataclass(chosen) and chosen is not spec.config_cls:
        raise ValueError(
            f"optimizer.name={name} does not match the chosen optimizer's config "
            f"({chosen.__name__}); choose the optimizer with optimizer=<name> instead"
        )
    return spec.config_cls


def _floats(values: Any, prefix: str = ""):
    if isinstance(values, dict):
        for key, value in values.items():
            yield from _floats(value, f"{prefix}{key}.")
    elif isinstance(values, list):
        for i, value in enumerate(values):
            yield from _floats(value, f"{prefix[:-1]}[{i}].")
    elif isinstance(values, float):
        yield prefix[:-1], values


MAX_LR = 100.0  # no optimizer here trains above it; 1e308 passed the finite check and overflowed


def check_values(cfg: Any, values: dict) -> None:
    """Cross-field and environment checks of the typed config ``cfg`` (a TrainConfig) and its
    plain dict ``values``; raise ValueError naming the first bad value."""
    for key, value in _floats(values):
        if not math.isfinite(value):
            raise ValueError(f"{key} must be a finite number, got {value}")
        last = key.rsplit(".", 1)[-1]
        if key.startswith("optimizer.") and (last == "lr" or last.endswith("_lr")
                                             or last.startswith("lr_")) and value > MAX_LR:  # fmt: skip
            raise ValueError(f"{key} must be at most {MAX_LR:g} (a step that large overflows the "
                             f"weights at once), got {value:g}")  # fmt: skip
    lr = getattr(cfg.optimizer, "lr", None)  # its value: the optimizer's config (optim/options.py)
    sched = cfg.schedule
    if lr is not None and sched.min_lr > lr:
        raise ValueError(f"schedule.min_lr ({sched.min_lr}) must not exceed optimizer.lr ({lr})")
    if sched.decay_steps is not None and sched.decay_steps < 1:
        raise ValueError(f"schedule.decay_steps must be >= 1 (or null), got {sched.decay_steps}")
    if cfg.seed < 0:  # numpy's generators (the data order) take no negative seed
        raise ValueError(f"seed must be a whole number >= 0, got {cfg.seed}")
    if cfg.eval_tokens is not None and cfg.eval_tokens < 1:
        raise ValueError(
            f"eval_tokens must be >= 1 (or null: the whole split), got {cfg.eval_tokens}"
        )
    check_paths(
        data_dir=cfg.data.dir,
        out_dir=cfg.out_dir,
        data_name=cfg.data.name,
        patterns=(cfg.data.train_pattern, cfg.data.val_pattern),
    )


def _creatable(path: Path) -> bool:
    """Whether ``path`` is a directory or could be made one (its nearest existing parent is a
    writable directory)."""
    for p in (path, *path.absolute().parents):
        if p.exists():
            return p.is_dir() and (p == path or os.access(p, os.W_OK | os.X_OK))
    return False


def check_paths(*, data_dir: str, out_dir: str | None, data_name: str = "",
                patterns: tuple[str, ...] = ()) -> None:  # fmt: skip
    """``data.dir`` holds shards (or is the embedded corpus's default, prepared on first use:
    ``data.missing_data_dir``); ``out_dir`` is a directory or can be made one."""
    from data.config import missing_data_dir

    if not _creatable(Path(data_dir)):
        raise ValueError(f"data.dir={data_dir} is not a directory and cannot be created there")
    missing = missing_data_dir(data_name, data_dir, *patterns)
    if missing:
        raise ValueError(missing)
    if out_dir is not None and not _creatable(Path(out_dir)):
        raise ValueError(f"out_dir={out_dir} is not a directory and cannot be created there")


def check_resume_source(resume: str, config: dict) -> None:
    """An explicit ``resume=PATH`` (file or run directory) names a readable checkpoint of this
    format whose model shapes and optimizer are the configured ones."""
    if resume in ("auto", "never"):
        return
    path = resolve_resume(resume, ".")
    saved = read_checkpoint(path)["config"]
    diffs = checkpoint_mismatch(saved if isinstance(saved, dict) else {}, config)
    if diffs:
        raise ValueError(
            f"resume={resume}: {path} is a checkpoint of another run ({'; '.join(diffs)}); "
            "resume with the same model and optimizer, or pick another checkpoint"
        )


def secret_values(environ: typing.Mapping[str, str] | None = None) -> list[str]:
    """Values of the environment's secret-looking variables: 12 characters or more without a
    path separator or a space (a ``*_KEY`` variable that holds a path is not redacted)."""
    env = os.environ if environ is None else environ
    return sorted(
        {v for k, v in env.items() if SECRET_NAME.search(k.upper()) and _secret_like(v)},
        key=len,
        reverse=True,
    )


def _secret_like(value: str) -> bool:
    return len(value) >= 12 and not any(c in value for c in "/\\ \t\n")


_SECRET_OVERRIDE = re.compile(r"^([+~]*[\w./@-]*?(?:_KEY|_TOKEN|_SECRET|PASSWORD|api_key|token)=)(.+)$",
                              re.IGNORECASE)  # fmt: skip


def redact(obj: Any, secrets: list[str] | None = None) -> Any:
    """``obj`` (str, list, dict) with every secret value replaced, and the value of every
    ``KEY=value`` string whose key names a secret (``hydra.job.env_set.WANDB_API_KEY=...``)."""
    secrets = secret_values() if secrets is None else secrets
    if isinstance(obj, dict):
        return {k: redact(v, secrets) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact(v, secrets) for v in obj)
    if isinstance(obj, str):
        for s in secrets:
            obj = obj.replace(s, REDACTED)
        return _SECRET_OVERRIDE.sub(lambda m: m.group(1) + REDACTED, obj)
    return obj


def redact_file(path: Path) -> None:
    """Rewrite the YAML file ``path`` (Hydra's ``multirun.yaml``, which records the command line)
    with its secrets redacted, if it has any."""
    import yaml

    from runtime.files import atomic_open

    if not path.is_file():
        return
    data = yaml.safe_load(path.read_text())
    clean = redact(data)
    if clean != data:
        with atomic_open(path, "w") as f:
            f.write(yaml.safe_dump(clean, sort_keys=False))
