"""The typed data config and the shard lists it names."""

from __future__ import annotations

import itertools
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
    # the fraction of the training windows a run may see (1: all): a fixed subset, the same for
    # every seed (``np.random.default_rng(SUBSET_SEED)``), so a cell can repeat its data as a
    # larger batch does (docs/data.md, "A fraction of the training data"); shuffle sampling only
    train_fraction: float = 1.0

    def __post_init__(self) -> None:
        from data.vocabs import get_vocab

        get_vocab(self.tokenizer)
        f = self.train_fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1:
            raise ValueError(f"data.train_fraction={f!r}: a number in (0, 1], e.g. 0.25 (a "
                             "quarter of the training windows); 1 trains on all of them")  # fmt: skip
        if f < 1 and self.sampling != "shuffle":
            raise ValueError(f"data.train_fraction={f} needs data.sampling=shuffle (a subset of "
                             f"windows), not {self.sampling!r}")  # fmt: skip
        if self.sampling not in SAMPLING:
            raise ValueError(
                f"unknown data.sampling {self.sampling!r}; valid: {', '.join(SAMPLING)}"
            )


def default_dir(name: str, tokenizer: str = "gpt2") -> Path:
    """The directory the project owns for source ``name`` (``data/shards/<name>``, or
    ``data/shards/<name>-<tokenizer>`` for another tokenizer, as configs/data/sotu-bytes.yaml):
    the only one it ever prepares into by itself (the embedded corpus, on first use)."""
    return Path("data/shards") / (name if tokenizer == "gpt2" else f"{name}-{tokenizer}")


def is_default_dir(name: str, directory: str | Path) -> bool:
    from data.vocabs import VOCABS

    path = Path(directory).absolute()
    return any(path == default_dir(name, t).absolute() for t in ("gpt2", *VOCABS))


def missing_data_dir(name: str, directory: str | Path, train_pattern: str = "*_train_*.bin",
                     val_pattern: str = "*_val_*.bin") -> str | None:  # fmt: skip
    """Why ``directory`` cannot be ``data.dir``, in one line naming the ``python -m data.prepare``
    command, or None when it is fine: it holds train and val shards, or it is the source's
    default directory ``data/shards/<name>`` (there the embedded corpus is prepared on first
    use, and any other source's message says how to prepare it). Nothing is ever written into a
    folder the user did not name as an output: a mistyped path, an empty folder or a folder of
    text files is refused, never filled."""
    path = Path(directory)
    if is_default_dir(name, path):
        return None
    source = name or "SOURCE"
    if not path.exists():
        return (
            f"data.dir={directory} does not exist; give the directory of the token shards, or "
            f"prepare the {name or 'data'} corpus into it first: "
            f"python -m data.prepare {source} --out {directory}"
        )
    if not path.is_dir() or _has(path, train_pattern) and _has(path, val_pattern):
        return None  # not a directory: check_paths says so
    documents = _documents(path)
    if documents:  # the user's own text: prepared into a new directory, never beside it
        out = default_dir(path.resolve().name or "mine")
        return (
            f"data.dir={directory} holds no token shards ({train_pattern}, {val_pattern}) but "
            f"{documents} document files: prepare them into shards first with "
            f"python -m data.prepare {directory} --out {out}, then train with data.dir={out}"
        )
    return (
        f"data.dir={directory} holds no token shards ({train_pattern}, {val_pattern}); "
        f"prepare them with: python -m data.prepare {source} --out {directory}"
    )


def _has(path: Path, pattern: str) -> bool:
    return any(p.is_file() for p in path.glob(pattern))


def _documents(path: Path, look_at: int = 10_000) -> int:
    """The files of ``path`` (recursively, the first ``look_at`` entries: a huge folder is not
    walked whole for a message) that ``python -m data.prepare`` reads as documents."""
    from data.sources import file_kind  # light: no torch, no tokenizer

    entries = itertools.islice(path.rglob("*"), look_at)
    return sum(1 for p in entries if p.is_file() and file_kind(p))


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


def check_shards(
    model_vocab: int, cfg: DataConfig, sample_tokens: int = 1 << 20, seq_len: int | None = None
) -> str | None:
    """Why the shards of ``cfg`` cannot feed a model of ``model_vocab`` tokens, or None: every
    shard's header (cut short, another format), a split none of whose shards holds one window
    of ``seq_len`` + 1 tokens (``short_split``), ``check_tokenizer``, and the first
    ``sample_tokens`` of the first train and validation shards against the vocabulary (a shard
    made by another tokenizer fails there, before the run directory is touched, not as an
    embedding's index error at the first step). Reads headers and a few MB only."""
    from data.shards import ShardError, load_shard, read_header

    try:
        train, val = shard_files(cfg)
        lengths = {path: read_header(path) for path in (*train, *val)}
        for split, files in (("training", train), ("validation", val)):
            if seq_len is not None and (why := short_split(split, files, lengths, seq_len, cfg)):
                return why
        if why := check_tokenizer(model_vocab, cfg):
            return why
        for path in (train[0], val[0]):
            tokens = load_shard(path)[:sample_tokens]
            if tokens.size and int(tokens.max()) >= model_vocab:
                load_shard(path, validate_vocab=model_vocab)  # names the first bad token
    except ShardError as exc:
        return str(exc)
    return None


def short_split(
    split: str, files: list[Path], lengths: dict[Path, int], seq_len: int, cfg: DataConfig
) -> str | None:
    """Why ``files`` (one split's shards, with their numbers of tokens) hold no window of
    ``seq_len`` + 1 tokens, naming the longest shard and the fix; None where one does. A shard
    shorter than a window is skipped by the loader, so only a split with none left fails."""
    longest = max(files, key=lambda p: lengths[p])
    n = lengths[longest]
    if n >= seq_len + 1:
        return None
    others = (
        f" (and the {len(files) - 1} other {split} shard(s) are no longer)"
        if len(files) > 1
        else ""
    )
    fix = f"a seq_len of at most {n - 1}, or " if n > 1 else ""
    return (f"{longest} holds {n:,} tokens, shorter than one window of seq_len+1 = {seq_len + 1:,} "
            f"tokens{others}: no {split} window to read. Use {fix}more {split} data (python -m "
            f"data.prepare {cfg.name} --out {cfg.dir} with more documents)")  # fmt: skip
