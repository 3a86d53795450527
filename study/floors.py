"""The floor any model must beat: unigram and bigram losses of the validation split, with the
statistics of the training split (add-one smoothing), in nats per token like the runs' loss."""

from __future__ import annotations

import numpy as np

from data.config import DataConfig, shard_files
from data.prepare import ensure_prepared
from data.shards import load_shard
from data.vocabs import get_vocab


def ngram_losses(data: DataConfig) -> dict[str, float]:
    """``{"unigram": nats, "bigram": nats, "val_tokens": n}`` for ``data``'s shards. The embedded
    corpus is prepared first where its default directory has none, as ``train.py`` does: a fresh
    clone whose runs are all restored from the committed files reports without training."""
    ensure_prepared(data.name, data.dir, data.tokenizer, data.val_fraction)
    train_files, val_files = shard_files(data)
    v = get_vocab(data.tokenizer).vocab_size
    train = np.concatenate([np.asarray(load_shard(f), dtype=np.int64) for f in train_files])
    val = np.concatenate([np.asarray(load_shard(f), dtype=np.int64) for f in val_files])
    uni = np.bincount(train, minlength=v) + 1.0
    uni_logp = np.log(uni / uni.sum())
    big = np.bincount(train[:-1] * v + train[1:], minlength=v * v).reshape(v, v) + 1.0
    big_logp = np.log(big / big.sum(axis=1, keepdims=True))
    # the runs predict every token of a window but its first from its past: both floors score
    # every validation token after the first (a bigram needs one token before)
    return {
        "unigram": float(-uni_logp[val[1:]].mean()),
        "bigram": float(-big_logp[val[:-1], val[1:]].mean()),
        "val_tokens": int(len(val)),
    }
