"""Compose the project's Hydra config in tests, with a fast tiny-model setting."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = ROOT / "configs"

# A model small enough for seconds-long CPU runs (the 50304-token head still dominates).
FAST = [
    "model.n_layer=2",
    "model.n_head=2",
    "model.n_embd=32",
    "model.block_size=32",
    "batch_tokens=256",
    "micro_batch_size=4",
    "eval_tokens=1024",
    "eval_every=4",
    "log_every=1",
    "progress=false",
    "schedule.warmup_steps=2",
    "optimizer.lr=3e-3",
]


def compose_config(*overrides: str):
    """The composed DictConfig for ``overrides`` (as on the command line)."""
    from trainer.command_line import register_schemas

    register_schemas()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name="config", overrides=list(overrides))


def fast_config(out_dir: Path, data_dir: Path, *overrides: str):
    """(typed config, plain dict) of a fast run writing to ``out_dir``."""
    from trainer import command_line

    cfg = compose_config(*FAST, f"out_dir={out_dir}", f"data.dir={data_dir}", *overrides)
    return command_line.to_typed(cfg)


def rendezvous(directory: Path | str) -> str:
    """A spawned process group's init_method: a new file under ``directory``. Unlike a free TCP
    port, nobody else can take it between the choice and the bind (gloo's own connections and
    another worker's groups open ports all the time), so two tests' groups never meet."""
    return f"file://{Path(directory).resolve()}/rendezvous-{uuid.uuid4().hex}"


def free_port() -> int:
    """A free TCP port on localhost, for a spawned process group's MASTER_PORT."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
