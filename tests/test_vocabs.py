"""The byte tokenizer (data/vocabs.py): text round trip, shards recording their tokenizer, the
one-line refusal of a model/tokenizer/shard mismatch, and the proxies whose blocks are the model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from data.config import DataConfig, check_tokenizer
from data.prepare import prepare
from data.shards import load_shard, read_tokenizer_id, write_shard
from data.vocabs import decode, encode, mismatch

ROOT = Path(__file__).resolve().parent.parent
PROXIES = ("proxy-100k", "proxy-200k", "proxy-450k", "proxy-1m")


def test_bytes_round_trip() -> None:
    text = "The State of the Union — façade, naïve, 日本, emoji 🙂."
    ids = encode("bytes", text)
    assert ids.max() < 256 and len(ids) == len(text.encode())
    assert decode("bytes", [256, *ids.tolist()]) == text  # the end-of-text token is dropped


def test_prepare_with_bytes_records_the_tokenizer(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    texts = [f"document {i}: " + "words and more words. " * (i + 1) for i in range(20)]
    for i, t in enumerate(texts):
        (docs / f"{i:02d}.txt").write_text(t)
    summary = prepare(str(docs), tmp_path / "out", tokenizer="bytes", val_fraction=0.1)
    assert summary["tokenizer"] == "bytes" and summary["vocab_size"] == 257
    shards = sorted((tmp_path / "out").glob("*.bin"))
    assert shards and all(read_tokenizer_id(p) == 1 for p in shards)
    tokens = [int(t) for p in shards for t in load_shard(p)]
    text = decode("bytes", tokens)
    assert all(t in text for t in texts) and len(text) == sum(len(t) for t in texts)


def test_mismatches_are_refused_with_one_line(tmp_path: Path) -> None:
    write_shard(tmp_path / "x_train_000000.bin", [256, 1, 2], tokenizer_id=1)
    write_shard(tmp_path / "x_val_000000.bin", [256, 3, 4], tokenizer_id=1)
    ok = DataConfig(dir=str(tmp_path), tokenizer="bytes")
    assert check_tokenizer(257, ok) is None
    why = check_tokenizer(50304, ok)  # a GPT-2-sized model on byte shards
    assert "model.vocab_size=50304" in why and "\n" not in why
    why = check_tokenizer(50304, DataConfig(dir=str(tmp_path), tokenizer="gpt2"))
    assert "made by bytes" in why and "data.tokenizer=gpt2" in why and "\n" not in why
    assert "model.vocab_size=257" in mismatch(257, "gpt2", {})
    with pytest.raises(ValueError, match="unknown tokenizer 'bpe'"):
        DataConfig(tokenizer="bpe")


@pytest.mark.slow
def test_train_refuses_a_mismatch(tmp_path: Path) -> None:
    write_shard(tmp_path / "x_train_000000.bin", list(range(300)), tokenizer_id=1)
    write_shard(tmp_path / "x_val_000000.bin", list(range(300)), tokenizer_id=1)
    cmd = [sys.executable, "train.py", "model=tiny", f"data.dir={tmp_path}", "data.tokenizer=bytes",
           "max_steps=1", f"out_dir={tmp_path / 'run'}", "progress=false"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].startswith("data error: model.vocab_size=50304")


@pytest.mark.parametrize("name", PROXIES)
def test_proxy_blocks_hold_90_percent(name: str) -> None:
    import torch

    from model import build_model
    from study.plan import block_params, model_config

    with torch.device("meta"):
        model = build_model(model_config(name))
    total = sum(p.numel() for p in model.parameters())
    blocks = block_params(name)
    assert blocks / total >= 0.90
    assert 0.09e6 <= blocks <= 1.1e6
    assert model.config.vocab_size == 257


def test_a_tokenizers_default_directory_is_prepared_on_first_use_others_are_refused():
    """data/shards/sotu-bytes (configs/data/sotu-bytes.yaml) is the project's own, like
    data/shards/sotu; a missing directory anywhere else is refused with the prepare command."""
    from data.config import default_dir, missing_data_dir

    assert default_dir("sotu", "bytes") == default_dir("sotu").with_name("sotu-bytes")
    assert missing_data_dir("sotu", "data/shards/sotu-bytes") is None
    assert "python -m data.prepare" in missing_data_dir("sotu", "data/shards/nowhere-bytes")
