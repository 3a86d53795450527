"""Tests of the data package: tokenizer, shard format, sotu preparation, loaders."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from data import (
    EOT,
    DataConfig,
    ShardError,
    TokenLoader,
    decode,
    encode,
    find_shards,
    load_shard,
    num_val_windows,
    read_header,
    shard_files,
    val_batches,
    write_shard,
)

T = 16
SHARD_LENGTHS = (1000, 517, 50, 10)  # the last one is too short to hold a window of T + 1


# ---------------------------------------------------------------- tokenizer


def test_tokenizer_known_ids_and_eot() -> None:
    assert encode("Hello world") == [15496, 995]
    assert EOT == 50256
    assert encode("<|endoftext|>") != [EOT]  # special tokens in text stay plain text


def test_tokenizer_round_trip_unicode() -> None:
    text = "Grüße, 世界! naïve café 🙂 — \t tabs\nand   spaces"
    assert decode(encode(text)) == text
    assert decode(np.array(encode(text), dtype=np.uint16)) == text


# ---------------------------------------------------------------- shards


def test_shard_round_trip_and_atomic(tmp_path: Path) -> None:
    tokens = np.random.default_rng(0).integers(0, 50257, size=1234)
    path = tmp_path / "sub" / "x_train_000000.bin"
    write_shard(path, tokens.tolist())
    assert read_header(path) == 1234
    assert path.stat().st_size == 1024 + 2 * 1234
    for mmap in (True, False):
        got = load_shard(path, mmap=mmap)
        assert got.dtype == np.uint16
        np.testing.assert_array_equal(got, tokens)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp files left
    write_shard(path, [])  # empty shards are valid too
    assert read_header(path) == 0 and len(load_shard(path)) == 0


def test_truncated_shard(tmp_path: Path) -> None:
    path = tmp_path / "t.bin"
    write_shard(path, np.arange(100))
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ShardError, match="expected 100 tokens") as err:
        load_shard(path)
    assert str(path) in str(err.value)
    path.write_bytes(b"\x00" * 10)  # shorter than the header
    with pytest.raises(ShardError, match=str(path)):
        read_header(path)


def test_foreign_and_wrong_version_files(tmp_path: Path) -> None:
    path = tmp_path / "foreign.bin"
    path.write_bytes(np.random.default_rng(1).bytes(4096))
    with pytest.raises(ShardError, match="is not a token shard") as err:
        read_header(path)
    assert str(path) in str(err.value) and "python -m data.prepare" in str(err.value)
    header = np.zeros(256, dtype="<i4")
    header[:3] = (20240520, 7, 0)
    path.write_bytes(header.tobytes())
    with pytest.raises(ShardError, match="version 7"):
        read_header(path)


def test_bad_tokens(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="65536"):
        write_shard(tmp_path / "a.bin", [1, 65536])
    with pytest.raises(ValueError, match="65536"):
        write_shard(tmp_path / "a.bin", [-1, 3])
    assert not list(tmp_path.iterdir())
    write_shard(tmp_path / "b.bin", [1, 60000, 2])
    with pytest.raises(ShardError, match="outside the vocabulary"):
        load_shard(tmp_path / "b.bin", validate_vocab=50257)


def test_find_shards(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"\*_train_\*\.bin") as err:
        find_shards(tmp_path, "*_train_*.bin")
    assert str(tmp_path) in str(err.value)
    for name in ("b_train_000001.bin", "b_train_000000.bin", "b_val_000000.bin"):
        write_shard(tmp_path / name, [1, 2, 3])
    names = [p.name for p in find_shards(tmp_path, "*_train_*.bin")]
    assert names == ["b_train_000000.bin", "b_train_000001.bin"]


def test_shard_files_says_how_to_prepare(tmp_path: Path) -> None:
    cfg = DataConfig(name="mysource", dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="python -m data.prepare mysource --out"):
        shard_files(cfg)
    write_shard(tmp_path / "s_train_000000.bin", [1, 2])
    write_shard(tmp_path / "s_val_000000.bin", [1, 2])
    train, val = shard_files(cfg)
    assert [p.name for p in train] == ["s_train_000000.bin"]
    assert [p.name for p in val] == ["s_val_000000.bin"]


def test_data_config_sampling() -> None:
    assert DataConfig().sampling == "shuffle"
    with pytest.raises(ValueError, match="unknown data.sampling 'uniform'; valid: shuffle, random"):
        DataConfig(sampling="uniform")


# ---------------------------------------------------------------- loader


@pytest.fixture()
def shards(tmp_path: Path) -> list[Path]:
    """Shards of unique random tokens, so a window is identified by its first token."""
    tokens = np.random.default_rng(0).permutation(sum(SHARD_LENGTHS))
    paths, start = [], 0
    for i, n in enumerate(SHARD_LENGTHS):
        paths.append(tmp_path / f"fx_train_{i:06d}.bin")
        write_shard(paths[-1], tokens[start : start + n])
        start += n
    return paths


def all_windows(paths: list[Path]) -> list[np.ndarray]:
    """Every window of T + 1 tokens, in file order."""
    out = []
    for p in paths:
        tok = load_shard(p).astype(np.int64)
        out += [tok[j * T : j * T + T + 1] for j in range((len(tok) - 1) // T)]
    return out


def make(paths: list[Path], **kwargs: object) -> TokenLoader:
    kwargs = {"batch_size": 4, "seq_len": T, "seed": 3, **kwargs}
    return TokenLoader(paths, **kwargs)


def take(loader: TokenLoader, steps: int) -> list[int]:
    """First token of each window in the next ``steps`` batches."""
    return [int(v) for _ in range(steps) for v in loader.next_batch()[0][:, 0]]


def test_windows_and_every_window_once_per_epoch(shards: list[Path]) -> None:
    windows = {int(w[0]): w for w in all_windows(shards)}
    loader = make(shards[::-1], batch_size=5)  # file order is by name, whatever the given order
    n = loader.num_windows
    assert n == len(windows) == 62 + 32 + 3 and loader.tokens_per_epoch == n * T
    seen = []
    while len(seen) < 2 * n:
        x, y = loader.next_batch()
        assert x.shape == y.shape == (5, T) and x.dtype == y.dtype == torch.int64
        torch.testing.assert_close(x[:, 1:], y[:, :-1])
        for xi, yi in zip(x, y):
            w = windows[int(xi[0])]
            assert xi.tolist() == w[:-1].tolist() and yi.tolist() == w[1:].tolist()
        seen += x[:, 0].tolist()
    assert sorted(seen[:n]) == sorted(windows) == sorted(seen[n : 2 * n])
    assert seen[:n] != seen[n : 2 * n]  # a new order each epoch
    assert loader.epoch == len(seen) // n


def test_ranks_are_disjoint_and_match_one_process(shards: list[Path]) -> None:
    single = make(shards)
    ranks = [make(shards, rank=r, world_size=2) for r in range(2)]
    for _ in range(30):  # crosses several epoch boundaries (97 windows, 8 per step)
        a0, a1 = single.next_batch(), single.next_batch()
        b0, b1 = ranks[0].next_batch(), ranks[1].next_batch()
        for a, b in ((a0, b0), (a1, b1)):
            torch.testing.assert_close(a[0], b[0])
            torch.testing.assert_close(a[1], b[1])
    assert single.consumed == ranks[0].consumed == ranks[1].consumed == 240


def test_ranks_disjoint_within_epoch(shards: list[Path]) -> None:
    single = make(shards, batch_size=6)
    ranks = [make(shards, batch_size=3, rank=r, world_size=2) for r in range(2)]
    steps = single.num_windows // 6
    per_rank = [take(r, steps) for r in ranks]
    assert not set(per_rank[0]) & set(per_rank[1])
    assert sorted(per_rank[0] + per_rank[1]) == sorted(take(single, steps))


def test_peek_batch(shards: list[Path]) -> None:
    loader = make(shards, rank=1, world_size=3)
    loader.next_batch()
    peeked = [loader.peek_batch(a) for a in range(3)]
    assert loader.consumed == 12
    for p in peeked:
        nxt = loader.next_batch()
        torch.testing.assert_close(p[0], nxt[0])
        torch.testing.assert_close(p[1], nxt[1])
    with pytest.raises(ValueError, match="ahead"):
        loader.peek_batch(-1)


def test_state_dict_resume(shards: list[Path]) -> None:
    loader = make(shards)
    take(loader, 7)
    state = loader.state_dict()
    assert all(type(v) in (int, str) for v in state.values())
    expected = take(loader, 40)
    fresh = make(shards)
    fresh.load_state_dict(json.loads(json.dumps(state)))
    assert take(fresh, 40) == expected
    # Another batch size / world size continues the same order without repeats.
    bigger = [make(shards, batch_size=8, rank=r, world_size=2) for r in range(2)]
    for b in bigger:
        b.load_state_dict(state)
    got = [w for _ in range(10) for b in bigger for w in take(b, 1)]
    assert got == expected[: len(got)]


def test_load_state_dict_mismatch(shards: list[Path]) -> None:
    state = make(shards).state_dict()
    with pytest.raises(ValueError, match="seq_len=16 but this loader has seq_len=8"):
        make(shards, seq_len=8).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        make(shards, seed=4).load_state_dict(state)
    with pytest.raises(ValueError, match="num_windows"):
        make(shards[:1]).load_state_dict(state)


def test_loader_bad_arguments(shards: list[Path]) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        make(shards, batch_size=0)
    with pytest.raises(ValueError, match="seq_len"):
        make(shards, seq_len=0)
    with pytest.raises(ValueError, match="rank"):
        make(shards, rank=2, world_size=2)
    with pytest.raises(ValueError, match="1001 tokens"):
        make(shards, seq_len=1000)
    with pytest.raises(ValueError, match="no shard files"):
        make([])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        make([shards[0].with_name("missing.bin")])


def test_random_sampling(shards: list[Path]) -> None:
    """Random windows with replacement at any start position, a pure function of the position:
    peek equals next, ranks split as one process, and a restored position continues alike."""
    tokens = np.concatenate([load_shard(p) for p in shards]).astype(np.int64)
    where = {int(t): i for i, t in enumerate(tokens)}  # tokens are unique
    bounds = np.cumsum(SHARD_LENGTHS)
    loader = make(shards, sampling="random", batch_size=8)
    starts = []
    for _ in range(600):  # crosses blocks of 4096 samples
        x, y = loader.next_batch()
        torch.testing.assert_close(x[:, 1:], y[:, :-1])
        for row in torch.cat([x, y[:, -1:]], dim=1).tolist():
            i = where[row[0]]
            assert row == tokens[i : i + T + 1].tolist()
            assert np.searchsorted(bounds, i, "right") == np.searchsorted(bounds, i + T, "right")
            starts.append(i)
    assert len(set(starts)) < len(starts)  # with replacement
    assert {s % T for s in starts} == set(range(T))  # not only aligned windows
    assert loader.epoch == 4800 // loader.num_windows
    single = make(shards, sampling="random")
    ranks = [make(shards, sampling="random", rank=r, world_size=2) for r in range(2)]
    assert take(single, 4) == [w for _ in range(2) for r in ranks for w in take(r, 1)]
    peeked = [single.peek_batch(a)[0] for a in range(3)]
    state = single.state_dict()
    assert state["sampling"] == "random"
    for p in peeked:
        torch.testing.assert_close(p, single.next_batch()[0])
    fresh = make(shards, sampling="random")
    fresh.load_state_dict(state)
    assert [int(v) for p in peeked for v in p[:, 0]] == take(fresh, 3)
    with pytest.raises(ValueError, match="sampling='random'.*data.sampling=random"):
        make(shards).load_state_dict(state)
    with pytest.raises(ValueError, match="unknown sampling"):
        make(shards, sampling="uniform")


def test_few_open_shards_read_the_same(shards: list[Path]) -> None:
    for sampling in ("shuffle", "random"):
        a = make(shards, sampling=sampling)
        b = make(shards, sampling=sampling, max_open_shards=1)
        assert take(a, 30) == take(b, 30)
        assert len(b._windows._open) == 1


def test_tokens_outside_vocabulary(tmp_path: Path) -> None:
    path = tmp_path / "other_train_000000.bin"
    write_shard(path, np.full(200, 50300))
    with pytest.raises(ShardError, match=rf"{path} holds token 50300 at position \d+, outside"):
        make([path]).next_batch()
    write_shard(path, [*range(5), 50300, *range(194)])
    with pytest.raises(
        ShardError, match="token 50300 at position 5, outside the vocabulary of 50257"
    ):
        next(iter(val_batches([path], batch_size=2, seq_len=T)))
    loader = make([path], vocab_size=50304, batch_size=12)
    assert int(loader.next_batch()[0].max()) == 50300


# ---------------------------------------------------------------- validation


def val_firsts(paths: list[Path], **kwargs: int) -> list[int]:
    """First token of each window that val_batches yields."""
    batches = val_batches(paths, seq_len=T, **kwargs)
    return [int(v) for x, y in batches for v in x[(y != -1).any(dim=1), 0]]


def test_val_batches(shards: list[Path]) -> None:
    firsts = [int(w[0]) for w in all_windows(shards)]
    batches = list(val_batches(shards, batch_size=10, seq_len=T, pad=False))
    assert [len(x) for x, _ in batches] == [10] * 9 + [7]
    padded = list(val_batches(shards, batch_size=10, seq_len=T))
    assert [len(x) for x, _ in padded] == [10] * 10
    assert torch.equal(padded[-1][1][:7], batches[-1][1]) and (padded[-1][1][7:] == -1).all()
    torch.testing.assert_close(batches[0][0][:, 1:], batches[0][1][:, :-1])
    assert val_firsts(shards, batch_size=10) == firsts
    assert val_firsts(shards[::-1], batch_size=10) == firsts  # file order is by name
    per_rank = [val_firsts(shards, batch_size=4, rank=r, world_size=3) for r in range(3)]
    assert per_rank[1] == firsts[1::3]
    assert sorted(sum(per_rank, [])) == sorted(firsts)


def test_val_max_tokens(shards: list[Path]) -> None:
    assert num_val_windows(shards, seq_len=T) == 97
    assert num_val_windows(shards, seq_len=T, max_tokens=10 * T + 5) == 10
    assert num_val_windows(shards, seq_len=T, max_tokens=10**9) == 97
    got = [y for _, y in val_batches(shards, batch_size=4, seq_len=T, max_tokens=10 * T)]
    assert sum(int((y != -1).sum()) for y in got) == 10 * T  # real targets: the budget
    assert [len(y) for y in got] == [4, 4, 4]  # the last batch padded
    with pytest.raises(ValueError, match="max_tokens"):
        val_batches(shards, batch_size=4, seq_len=T, max_tokens=T - 1)


def test_loader_reads_prepared_sotu(sotu_dir: Path) -> None:
    train, val = shard_files(DataConfig(dir=str(sotu_dir)))
    loader = TokenLoader(train, batch_size=2, seq_len=64)
    x, y = loader.next_batch()
    assert x.shape == (2, 64) and int(x.max()) < 50257
    assert loader.num_windows == (read_header(train[0]) - 1) // 64
    assert next(iter(val_batches(val, batch_size=2, seq_len=64)))[0][0, 0] == EOT
    assert os.path.getsize(val[0]) == 1024 + 2 * read_header(val[0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_loader_on_cuda(shards: list[Path]) -> None:
    cpu, gpu = make(shards), make(shards, device="cuda")
    for _ in range(3):
        (xc, yc), (xg, yg) = cpu.next_batch(), gpu.next_batch()
        assert xg.is_cuda and yg.is_cuda
        torch.testing.assert_close(xg.cpu(), xc)
        torch.testing.assert_close(yg.cpu(), yc)


@pytest.mark.parametrize("sampling", ["shuffle", "random"])
def test_prefetch_gives_the_same_batches_and_resumes_the_same(
    shards: list[Path], sampling: str
) -> None:
    plain = make(shards, rank=1, world_size=2, sampling=sampling, prefetch=0)
    ahead = make(shards, rank=1, world_size=2, sampling=sampling, prefetch=3)
    assert plain._reader is None and ahead._reader is not None
    for step in range(40):  # crosses epochs; peeks as exact MARS does
        if step % 3 == 0:
            assert torch.equal(plain.peek_batch(1)[0], ahead.peek_batch(1)[0])
        a, b = plain.next_batch(), ahead.next_batch()
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert len(ahead._ahead) == 3  # batches in flight when the position is saved
    state = ahead.state_dict()
    assert state == plain.state_dict()
    expected = take(plain, 10)
    resumed = make(shards, rank=1, world_size=2, sampling=sampling, prefetch=3)
    take(resumed, 5)  # its own read-ahead, from another position
    resumed.load_state_dict(state)
    assert take(resumed, 10) == expected and take(ahead, 10) == expected
    ahead.close()
    assert take(ahead, 2) == take(plain, 2)  # closed: reads on the calling thread
    with pytest.raises(ValueError, match="prefetch"):
        make(shards, prefetch=-1)
