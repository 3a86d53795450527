"""The GPT-2 BPE tokenizer, built offline from the ranks file shipped next to this module.

``tiktoken.get_encoding("gpt2")`` downloads its BPE file, which fails without network access, so
we build the same encoding from ``data/gpt2.tiktoken`` (OpenAI's r50k/gpt2 ranks, pinned by hash).
"""

from __future__ import annotations

import base64
import functools
import hashlib
from collections.abc import Iterable
from pathlib import Path

import tiktoken

EOT: int = 50256
VOCAB_SIZE: int = 50257

BPE_PATH = Path(__file__).with_name("gpt2.tiktoken")
BPE_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
# The r50k_base / gpt2 pre-tokenisation pattern, as tiktoken defines it.
GPT2_PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def _load_ranks(path: Path) -> dict[bytes, int]:
    """Read and hash-check a ``.tiktoken`` ranks file (lines of ``base64(token) rank``).

    Same result as ``tiktoken.load.load_tiktoken_bpe(path, expected_hash=...)``, but that
    function also copies local files into a cache under the temp dir and would then keep
    serving the cached copy if the file in the checkout got corrupted; here the file on disk
    is checked every time.
    """
    contents = path.read_bytes()
    digest = hashlib.sha256(contents).hexdigest()
    if digest != BPE_SHA256:
        raise ValueError(
            f"GPT-2 BPE ranks file {path} is corrupt (sha256 {digest} != {BPE_SHA256}); "
            "restore it from git (git checkout -- data/gpt2.tiktoken)"
        )
    ranks = {}
    for line in contents.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


@functools.lru_cache(maxsize=1)
def get_tokenizer() -> tiktoken.Encoding:
    """Return the GPT-2 encoding (cached), built from the local ranks file.

    Raises FileNotFoundError if the ranks file is missing and ValueError if its hash is wrong.
    """
    if not BPE_PATH.is_file():
        raise FileNotFoundError(
            f"GPT-2 BPE ranks file not found at {BPE_PATH}; restore it from git "
            "(git checkout -- data/gpt2.tiktoken) or take whisper/assets/gpt2.tiktoken from "
            "the PyPI source package openai-whisper==20250625"
        )
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=GPT2_PAT_STR,
        mergeable_ranks=_load_ranks(BPE_PATH),
        special_tokens={"<|endoftext|>": EOT},
    )


def encode(text: str) -> list[int]:
    """Encode text to GPT-2 token ids; special tokens in the text are treated as plain text."""
    return get_tokenizer().encode_ordinary(text)


def decode(ids: Iterable[int]) -> str:
    """Decode GPT-2 token ids (any iterable of ints, e.g. a list or numpy array) to text."""
    return get_tokenizer().decode([int(i) for i in ids])
