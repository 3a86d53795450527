"""``data.train_fraction``: a run sees a fixed subset of the training windows, the same for
every seed, each once per epoch (the crossover's repetition control: docs/study.md)."""

import numpy as np
import pytest

from data.config import DataConfig
from data.loader import TokenLoader
from data.shards import write_shard


def _windows(tmp_path, n_windows=40, seq=8):
    path = tmp_path / "t_train_000000.bin"
    # token t of window j is j (the window's id), so a batch names its windows
    tokens = np.repeat(np.arange(n_windows), seq)
    write_shard(path, np.append(tokens, 0), tokenizer_id=1)
    return [path]


def _seen(loader, steps):
    return [int(x[0, 0]) for x, _ in (loader.next_batch() for _ in range(steps))]


def test_a_quarter_is_one_fixed_subset_visited_once_an_epoch(tmp_path):
    files = _windows(tmp_path)
    a = TokenLoader(files, batch_size=1, seq_len=8, seed=1, vocab_size=257, fraction=0.25)
    b = TokenLoader(files, batch_size=1, seq_len=8, seed=2, vocab_size=257, fraction=0.25)
    assert a.num_windows == b.num_windows == 10
    first, second = _seen(a, 10), _seen(a, 10)
    assert sorted(first) == sorted(second) == sorted(_seen(b, 10))  # the same ten windows
    assert len(set(first)) == 10 and first != second  # each once an epoch, reshuffled
    whole = TokenLoader(files, batch_size=1, seq_len=8, seed=1, vocab_size=257)
    assert whole.num_windows == 40 and len(set(_seen(whole, 40))) == 40


@pytest.mark.parametrize("bad", [0, 1.5, -0.1, True])
def test_a_fraction_outside_zero_one_is_refused_in_one_line(bad):
    with pytest.raises(ValueError, match=r"data.train_fraction=.*a number in \(0, 1\]"):
        DataConfig(tokenizer="bytes", train_fraction=bad)
    with pytest.raises(ValueError, match="needs data.sampling=shuffle"):
        DataConfig(tokenizer="bytes", train_fraction=0.5, sampling="random")
