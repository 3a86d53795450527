"""A trained model for evaluation, sampling or export, from any of the places one can live.

``load_model(PATH)`` accepts a checkpoint file (``runs/X/checkpoints/step_N.pt``) or DCP directory
(``runs/X/checkpoints/step_N/``: only its model is read), a run directory
(its newest checkpoint), or a Hugging Face GPT-2 or LLaMA directory (``config.json`` + weights,
e.g. one written by ``scripts/export_hf.py``). Checkpoints carry their run's resolved config, so the model
(and, for validation loss, the data) is rebuilt exactly as trained.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from model import CausalLM, GPTConfig, build_model
from model.hf import is_hf_dir, load_hf
from runtime import runfiles
from trainer import checkpoint as ckpt
from trainer.dcp_checkpoint import METADATA, TRAIN_STATE, load_dcp

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    """A model in eval mode and what is known of where it came from."""

    model: CausalLM  # GPT or Llama
    source: Path  # the checkpoint file or the HF directory
    kind: str  # "checkpoint" or "hf"
    step: int | None = None
    run_config: dict[str, Any] = field(default_factory=dict)  # the training config, if any

    @property
    def run_dir(self) -> Path | None:
        """The run directory of a checkpoint under ``<run>/checkpoints/``."""
        if self.kind == "checkpoint" and self.source.parent.name == runfiles.CHECKPOINTS:
            return self.source.parent.parent
        return None

    def default_results_path(self) -> Path:
        """``<run>/eval/step_N.json`` next to the run, else beside the checkpoint or HF dir."""
        if self.run_dir is not None:
            return self.run_dir / runfiles.EVAL / f"{self.source.stem}.json"
        if self.kind == "hf":
            return self.source / "eval.json"
        return self.source.with_suffix(".eval.json")


def resolve_checkpoint(path: str | Path) -> tuple[Path, str]:
    """(file or directory, kind) for a checkpoint file, run directory or HF directory."""
    p = Path(path)
    if p.is_file() or looks_like_dcp(p):
        return p, "checkpoint"
    if is_hf_dir(p):
        return p, "hf"
    if p.is_dir():
        found = ckpt.latest_checkpoint(p)
        if found is None:
            raise FileNotFoundError(
                f"{p} holds no checkpoints ({ckpt.checkpoint_dir(p)} is empty or missing) and no "
                "Hugging Face config.json; pass a step_N.pt file, a run directory or an HF directory"
            )
        return found, "checkpoint"
    raise FileNotFoundError(
        f"checkpoint={path}: no such file or directory; pass a step_N.pt file, a run directory "
        "or a Hugging Face model directory"
    )


TRAIN_ADVICE = "; resume=auto falls back to the previous checkpoint"  # train.py's, not ours


def bad_checkpoint_line(exc: BaseException, asked: str | Path) -> str:
    """eval.py's one line for a checkpoint it cannot use: the reason, and eval's own way out
    (another ``checkpoint=``: the next older one of the same run, if there is one), never
    train.py's ``resume=`` advice."""
    why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    why = why.split(TRAIN_ADVICE)[0]
    for tail in ("; pick another checkpoint", "; pick another"):
        why = why.removesuffix(tail)
    path = Path(asked)
    run = path if ckpt.checkpoint_dir(path).is_dir() else path.parent.parent
    bad = ckpt.latest_checkpoint(run) if run == path else path  # the one load_model tried
    older = [p for p in ckpt.list_checkpoints(run) if bad is None or p.name < bad.name]
    other = f"checkpoint={older[-1]} (the next older one)" if older else "another checkpoint="
    return f"{why}; evaluate {other}, a run directory or a Hugging Face directory"


def looks_like_dcp(path: Path) -> bool:
    """A DCP checkpoint directory, complete or not (``load_dcp`` says what an incomplete lacks)."""
    return (path / METADATA).is_file() or (path / TRAIN_STATE).is_file()


def gpt_config(model_cfg: dict[str, Any], source: str) -> GPTConfig:
    """The GPTConfig saved in a run config (keys this code does not know are an error)."""
    known = {f.name for f in fields(GPTConfig)}
    unknown = sorted(set(model_cfg) - known)
    if unknown:
        raise ValueError(f"{source}: model config has keys this code does not know: {unknown}")
    return GPTConfig(**model_cfg)


def load_model(path: str | Path, device: torch.device | str = "cpu") -> LoadedModel:
    """Load the model at ``path`` (see the module docstring) onto ``device`` in eval mode."""
    source, kind = resolve_checkpoint(path)
    if kind == "hf":
        model = load_hf(source)
        loaded = LoadedModel(model, source, kind)
    else:
        c = load_dcp(source, parts=("model",)) if source.is_dir() else ckpt.load_checkpoint(source)
        config = c["config"]
        if not isinstance(config, dict) or "model" not in config:
            raise ValueError(f"{source} carries no model config; cannot rebuild the model")
        model = build_model(gpt_config(config["model"], str(source)))
        # the run's loss path, so the validation loss equals the one training logged, bit for bit
        model.loss_chunk_tokens = int(config.get("loss_chunk_tokens") or 0)
        ckpt.load_model_state(model, c["model"], str(source))
        loaded = LoadedModel(model, source, kind, step=int(c["step"]), run_config=config)
    loaded.model.to(device).eval()
    log.info(
        "loaded %s (%s, step %s): %.2fM parameters",
        source,
        kind,
        loaded.step,
        loaded.model.num_params() / 1e6,
    )
    return loaded
