"""Checkpoints that restore everything: model, optimizer state, step, data position, RNG.

Files are ``<out_dir>/checkpoints/step_<N>.pt`` (N = completed optimizer steps), written to a
temporary file and renamed, so a crash never leaves a half-written checkpoint under that name.
They hold only tensors and plain Python values and load with ``torch.load(weights_only=True)``.
A checkpoint may also be a DCP directory ``step_<N>/`` (``checkpoint_format=dcp``,
``trainer.dcp_checkpoint``); the functions here list, prune and load both kinds alike.
"""

from __future__ import annotations

import logging
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from model.gpt import tied_state_dict
from runtime import runfiles
from runtime.distributed import DistInfo, broadcast_object, gather_objects
from trainer import checksums
from trainer.checksums import save_checksummed
from trainer.dcp_checkpoint import is_dcp_checkpoint, load_dcp, short_reason, write_failure
from trainer.fsdp import has_dtensors
from trainer.safe_metadata import bounded

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
_STEP_FILE = re.compile(r"^step_(\d+)(\.pt)?$")  # a file, or a DCP directory
REQUIRED_KEYS = ("format_version", "step", "model", "optimizer", "loader", "rng", "config")
# model.* keys that do not change the shapes of the weights: a checkpoint may differ in them.
SHAPELESS_MODEL_KEYS = frozenset({"name", "dropout"})
_ZIP_MAGIC = b"PK\x03\x04"


def checkpoint_dir(out_dir: str | Path) -> Path:
    return Path(out_dir) / runfiles.CHECKPOINTS


def list_checkpoints(out_dir: str | Path) -> list[Path]:
    """Step checkpoints of a run directory, oldest first."""
    d = checkpoint_dir(out_dir)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := _STEP_FILE.match(p.name))]
    return [p for _, p in sorted(found) if p.suffix == ".pt" or is_dcp_checkpoint(p)]


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    ckpts = list_checkpoints(out_dir)
    return ckpts[-1] if ckpts else None


def resolve_resume(resume: str, out_dir: str | Path) -> Path | None:
    """The checkpoint to start from: ``auto`` (newest in out_dir, if any), ``never``, or a path
    to a checkpoint file or to a run directory (its newest checkpoint)."""
    if resume == "never":
        return None
    if resume == "auto":
        return latest_checkpoint(out_dir)
    path = Path(resume)
    if path.is_file() or is_dcp_checkpoint(path):
        return path
    if path.is_dir():
        found = latest_checkpoint(path)
        if found is None:
            raise FileNotFoundError(f"resume={resume}: no checkpoints in {checkpoint_dir(path)}")
        return found
    raise FileNotFoundError(
        f"resume={resume}: no such checkpoint file or run directory; "
        "use resume=auto, resume=never, or a path to a step_N.pt file or a run directory"
    )


def rng_state(device: torch.device) -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "cuda": None}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"], device)


def save_checkpoint(out_dir: str | Path, step: int, payload: dict[str, Any], keep: int) -> Path:
    """Write ``payload`` (see REQUIRED_KEYS) atomically as step ``step``; keep the newest ``keep``
    step checkpoints (0 keeps all). Call on one rank only."""
    payload = {"format_version": FORMAT_VERSION, "step": step, **payload}
    missing = [k for k in REQUIRED_KEYS if k not in payload]
    assert not missing, f"checkpoint payload lacks {missing}"
    d = checkpoint_dir(out_dir)
    path = d / f"step_{step:07d}.pt"
    try:
        d.mkdir(parents=True, exist_ok=True)
        remove_leftover_temp_files(d)
        save_checksummed(payload, path)  # on failure the temporary file is removed
    except (OSError, RuntimeError) as exc:  # torch.save reports a full disk as RuntimeError
        raise CheckpointWriteError(path, exc) from exc
    if keep > 0:
        prune_checkpoints(out_dir, keep)
    return path


def prune_checkpoints(out_dir: str | Path, keep: int) -> None:
    """Delete all but the newest ``keep`` step checkpoints (files and DCP directories)."""
    for old in list_checkpoints(out_dir)[:-keep]:
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)
            checksums.sidecar(old).unlink(missing_ok=True)


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, permission denied, ...): says which file,
    what failed, that the older checkpoints are untouched, and what to do."""

    def __init__(self, path: Path, exc: BaseException) -> None:
        older = [p.name for p in list_checkpoints(path.parent.parent) if p != path]
        kept = f"the newest intact one is {older[-1]}" if older else "there is no older one"
        what = (
            exc.strerror if isinstance(exc, OSError) and exc.strerror else write_failure(exc, path)
        )
        super().__init__(
            getattr(exc, "errno", None),
            f"could not write checkpoint {path}: {what}. Nothing was replaced ({kept}). "
            f"Free disk space or fix the permissions of {path.parent}, then run the same "
            "command again: resume=auto continues from the newest checkpoint",
        )

    def __str__(self) -> str:
        return self.strerror


def remove_leftover_temp_files(directory: Path) -> None:
    """Remove temporary files of checkpoints whose writer was killed (``.step_N.pt.*.tmp``);
    checkpoints are written by one process at a time, so no other writer owns them."""
    for tmp in directory.glob(".step_*.pt.*.tmp"):
        tmp.unlink(missing_ok=True)
        log.info("removed %s, left by an interrupted checkpoint write", tmp)
    for side in directory.glob(f"step_*.pt{checksums.SUFFIX}"):  # a kill before the rename
        if not side.with_suffix("").exists():
            side.unlink(missing_ok=True)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint (a file, or a DCP directory read whole into the same dict) onto the CPU
    with ``weights_only=True`` and check its structure and format (ValueError with a one-line
    reason; ``read_checkpoint``)."""
    return read_checkpoint(Path(path), mmap=False)


def load_with_fallback(path: Path, *, fall_back: bool) -> tuple[Path, dict[str, Any]]:
    """``(path, load_checkpoint(path))``; with ``fall_back`` (resume=auto), a checkpoint that
    cannot be read (a truncated or corrupt file) gives way to the next older one in its
    directory, with a warning. The error of the oldest is raised when none can be read."""
    older = [p for p in list_checkpoints(path.parent.parent) if p.name < path.name]
    candidates = [path, *reversed(older)] if fall_back else [path]
    for i, candidate in enumerate(candidates):
        try:
            return candidate, load_checkpoint(candidate)
        except ValueError as exc:
            if i == len(candidates) - 1:
                raise
            log.warning("%s\nfalling back to the previous checkpoint, %s", exc, candidates[i + 1])
    raise AssertionError("unreachable")


def load_model_state(model: torch.nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """``model.load_state_dict`` with a message that says which checkpoint does not fit."""
    state = {k.removeprefix("_orig_mod."): v for k, v in state.items()}
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise ValueError(
            f"the model in {source} does not fit the configured model (a different model= or "
            f"model.* setting?):\n{exc}"
        ) from exc


def _reason(exc: BaseException) -> str:
    """What is wrong with an unreadable checkpoint and the fix, as the end of one line."""
    fix = ("resume=auto falls back to the previous checkpoint; or delete the file, or pick "
           "another with resume=PATH")  # fmt: skip
    return f"{short_reason(exc)}; {fix}"


def read_checkpoint(path: Path, *, mmap: bool = True) -> dict:
    """The checkpoint at ``path`` with ``weights_only=True``; ``mmap`` maps its tensors instead of
    reading them (the config and format are read, the weights stay on disk). ValueError with a
    one-line reason when it is not a checkpoint of this code."""
    required = REQUIRED_KEYS
    if path.is_dir():  # a DCP checkpoint: with mmap, only its small non-tensor part is read
        c = load_dcp(path, parts=() if mmap else ("model", "optimizer"))
        required = [k for k in REQUIRED_KEYS if not mmap or k not in ("model", "optimizer")]
    else:
        with open(path, "rb") as f:
            if f.read(4) != _ZIP_MAGIC:
                raise ValueError(f"{path} is not a checkpoint (not a PyTorch file); pick another")
        if not mmap:  # a full load is checked first; a peek at the config (mmap) reads no weights
            checksums.verify(path)
        try:
            c = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        except Exception as exc:  # truncated, or objects that weights_only refuses
            raise ValueError(f"{path} is not a readable checkpoint: {_reason(exc)}") from None
        bounded(c, path)  # a crafted structure (shared references): refused before any walk
    c = check_checkpoint(c, path, required)
    if not mmap:
        checksums.note_unverified(path)  # read whole: only now, never before a refusal
    return c


def check_checkpoint(c: object, path: Path, required=None) -> dict:
    """``c`` if it has this codebase's checkpoint structure (``required`` keys, by default all)
    and format version; ValueError with a one-line reason otherwise."""
    missing = [k for k in required or REQUIRED_KEYS if not isinstance(c, dict) or k not in c]
    if missing:
        raise ValueError(f"{path} is not a checkpoint of this codebase (it lacks {missing})")
    version = c["format_version"]
    if version != FORMAT_VERSION:
        newer = isinstance(version, int) and version > FORMAT_VERSION
        raise ValueError(
            f"{path} has checkpoint format {version}, this code reads format {FORMAT_VERSION}"
            + ("; it was written by a newer version of this code: update it" if newer else "")
        )
    return c


def checkpoint_mismatch(saved: dict, config: dict) -> list[str]:
    """``key: checkpoint X, configured Y`` for each model shape key and the optimizer name that
    differ between a checkpoint's config ``saved`` and the configured ``config``."""
    old_model, new_model = saved.get("model") or {}, config.get("model") or {}
    diffs = [
        f"model.{k}: checkpoint {old_model.get(k, '<absent>')!r}, configured {new_model.get(k)!r}"
        for k in sorted(set(old_model) | set(new_model))
        if k not in SHAPELESS_MODEL_KEYS and old_model.get(k) != new_model.get(k)
    ]
    old_opt = (saved.get("optimizer") or {}).get("name")
    new_opt = (config.get("optimizer") or {}).get("name")
    if old_opt != new_opt:
        diffs.append(f"optimizer: checkpoint {old_opt!r}, configured {new_opt!r}")
    return diffs


# The one interface of training: a run's whole state saved (a file, or DCP) and restored.


def restore_training_state(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: Any,
    state: Any, dist: DistInfo, fall_back: bool = False,
) -> Path:  # fmt: skip
    """Load the checkpoint at ``path`` into the model, optimizer, loader (its data position),
    the counters and this rank's RNG streams (when the world size is the one that saved it).
    With ``fall_back`` (resume=auto) an unreadable checkpoint gives way to the previous one;
    returns the path loaded."""
    path, c = load_with_fallback(path, fall_back=fall_back)
    load_model_state(model, c["model"], str(path))
    optimizer.load_state_dict(c["optimizer"])
    loader.load_state_dict(c["loader"])
    state.step, state.tokens = c["step"], c.get("tokens", 0)
    state.best_val_loss = c.get("best_val_loss")
    state.last_val_loss, state.last_train_loss = c.get("last_val_loss"), c.get("last_train_loss")
    state.elapsed_s = c.get("elapsed_s", 0.0)
    state.skipped_steps = c.get("skipped_steps", 0)
    state.nonfinite_in_a_row = c.get("nonfinite_in_a_row", 0)  # absent before it was kept
    state.stopped, state.stop_message = c.get("stopped"), c.get("stop_message")
    if len(c["rng"]) == dist.world_size:
        set_rng_state(c["rng"][dist.rank], dist.device)
    else:
        n = len(c["rng"])
        log.warning("checkpoint has RNG states of %d ranks, not %d: reseeding", n, dist.world_size)
    log.info("resumed from %s at step %d (%s tokens)", path, state.step, f"{state.tokens:,}")
    return path


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict with the tied head stored once (``tied_state_dict``). A sharded
    (FSDP) model's tensors are DTensors, whose storage has no address to compare: the tied one is
    the same parameter object, which is how it is recognised there."""
    if not has_dtensors(model.state_dict()):
        return tied_state_dict(model)
    seen: set[int] = set()
    out = {}
    for key, t in model.state_dict(keep_vars=True).items():
        if id(t) not in seen:
            seen.add(id(t))
            out[key] = t.detach()
    return out


def save_training_state(
    out_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: Any,
    state: Any, *, config: dict, dist: DistInfo, keep: int, elapsed: Callable[[], float],
    dcp_saver: Any = None,
) -> None:  # fmt: skip
    """Every rank's RNG state is gathered (a collective: every rank calls this), then rank 0
    writes everything a resume needs as ``checkpoints/step_N.pt``, atomically; with
    ``dcp_saver``, every rank writes its share of the DCP directory ``checkpoints/step_N/``. A
    file write that fails stops every rank with one message (``CheckpointWriteError``); older
    checkpoints are kept."""
    extra = {
        "loader": loader.state_dict(),
        "rng": gather_objects(rng_state(dist.device)),
        "config": config,
        "tokens": state.tokens,
        "best_val_loss": state.best_val_loss,
        "last_val_loss": state.last_val_loss,  # for the summary of a run killed before it
        "last_train_loss": state.last_train_loss,
        "elapsed_s": elapsed(),
        "skipped_steps": state.skipped_steps,
        "nonfinite_in_a_row": state.nonfinite_in_a_row,  # a resumed run goes on counting
        "stopped": state.stopped,  # "diverged": a rerun is refused (trainer/run.py)
        "stop_message": state.stop_message,
    }
    if dcp_saver is not None:
        states = {"model": model_state(model), "optimizer": optimizer.state_dict()}
        side = {"format_version": FORMAT_VERSION, "step": state.step, **extra}
        prune = (lambda _: prune_checkpoints(out_dir, keep)) if keep > 0 else (lambda _: None)
        dcp_saver.save(checkpoint_dir(out_dir), state.step, states, side, prune)
        return
    t0, error = time.perf_counter(), None
    if dist.is_main:
        payload = {"model": tied_state_dict(model), "optimizer": optimizer.state_dict(), **extra}
        try:
            path = save_checkpoint(out_dir, state.step, payload, keep)
            log.info("saved %s (the loop was blocked %.2f s)", path, time.perf_counter() - t0)
        except CheckpointWriteError as exc:
            error = str(exc)
    error = broadcast_object(error)  # also the barrier: no rank runs ahead of the write
    if error:
        raise SystemExit(error)
