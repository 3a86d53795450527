"""The tokenizers a corpus can be prepared with, and the check that a run's model, its data
config and its shards agree on one.

- ``gpt2``: the GPT-2 BPE (50,257 tokens, ``data/tokenizer.py``), the papers' tokenizer.
- ``bytes``: the UTF-8 bytes of the text (256 tokens) plus ``<|endoftext|>`` = 256. With 257
  tokens the embedding of a small proxy model is a few percent of its parameters instead of most
  of them, so an optimizer comparison measures the transformer blocks (docs/study.md).

A shard records its tokenizer in header word 3 (``data/shards.py``): 0 is GPT-2, which is also
what every llm.c shard made elsewhere holds there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Vocab:
    name: str
    shard_id: int  # header word 3 of the shards it made
    vocab_size: int
    eot: int


VOCABS = {
    "gpt2": Vocab("gpt2", 0, 50257, 50256),
    "bytes": Vocab("bytes", 1, 257, 256),
}
PAD_TO = 128  # a model may pad its vocabulary (GPT-2's 50304) up to the next multiple of this


def get_vocab(name: str) -> Vocab:
    """The tokenizer called ``name``; ValueError naming the valid ones otherwise."""
    if name not in VOCABS:
        raise ValueError(f"unknown tokenizer {name!r}; valid tokenizers: {', '.join(VOCABS)}")
    return VOCABS[name]


def vocab_of_shard_id(shard_id: int) -> Vocab | None:
    return next((v for v in VOCABS.values() if v.shard_id == shard_id), None)


def encode(name: str, text: str) -> np.ndarray:
    """``text``'s tokens (no end-of-text) under tokenizer ``name``, as uint16."""
    if name == "bytes":
        # surrogatepass+replace: a lone surrogate becomes U+FFFD, as the GPT-2 path does
        data = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode()
        return np.frombuffer(data, dtype=np.uint8).astype(np.uint16)
    from data.tokenizer import get_tokenizer

    enc = get_tokenizer()
    try:
        ids = enc.encode_to_numpy(text, disallowed_special=())
    except UnicodeEncodeError:  # lone surrogates: replace them, as encode_ordinary does
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        ids = enc.encode_to_numpy(text, disallowed_special=())
    return ids.astype(np.uint16)


def decode(name: str, ids) -> str:  # noqa: ANN001 - any iterable of ints
    """Text of token ids under tokenizer ``name``; end-of-text tokens are dropped."""
    vocab = get_vocab(name)
    ids = [int(i) for i in ids if int(i) != vocab.eot]
    if name == "bytes":
        return bytes(ids).decode("utf-8", errors="replace")
    from data.tokenizer import decode as gpt2_decode

    return gpt2_decode(ids)


def mismatch(model_vocab: int, data_tokenizer: str, shard_ids: dict[str, int]) -> str | None:
    """Why a model of ``model_vocab`` tokens cannot train on shards ``{path: header id}`` that the
    data config says were made by ``data_tokenizer``; None when they agree."""
    vocab = get_vocab(data_tokenizer)
    for path, shard_id in shard_ids.items():
        found = vocab_of_shard_id(shard_id)
        if found is None or found.name != vocab.name:
            made = found.name if found else f"unknown tokenizer id {shard_id}"
            return (
                f"{path} was made by {made}, but data.tokenizer={vocab.name}: set "
                f"data.tokenizer={made} or prepare the shards with --tokenizer {vocab.name}"
            )
    padded = -(-vocab.vocab_size // PAD_TO) * PAD_TO
    if not vocab.vocab_size <= model_vocab <= padded:
        return (
            f"model.vocab_size={model_vocab} does not fit the {vocab.name} tokenizer's "
            f"{vocab.vocab_size} tokens (allowed {vocab.vocab_size}..{padded}): pair the model "
            f"with data of its tokenizer (model=proxy-* with data=sotu-bytes, GPT-2 sizes with "
            f"data=sotu) or set model.vocab_size"
        )
    return None
