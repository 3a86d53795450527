"""GPT-2 tokenizer files for Hugging Face (vocab.json, merges.txt), rebuilt from tiktoken's ranks.

The project's tokenizer is tiktoken's r50k/gpt2 encoding built offline from ``data/gpt2.tiktoken``
(byte strings and their ranks). Hugging Face's GPT-2 tokenizer wants the original files instead:

- ``vocab.json`` maps each token to its id, the token written in GPT-2's byte-to-unicode alphabet
  (every byte a printable character, e.g. the space 0x20 as ``Ġ``);
- ``merges.txt`` lists the BPE merges in priority order, one ``left right`` pair per line.

In GPT-2's BPE, token ``256 + i`` is the result of merge ``i``, so the merges are recovered in rank
order: for each multi-byte token, run the BPE itself on the token's bytes with only the lower-ranked
merges allowed; the two parts it ends with are that token's merge. This reproduces tiktoken's
encoding (it is tested equal on real text), giving 50,000 merges as the original file has.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from data.tokenizer import EOT, get_tokenizer

EOT_TEXT = "<|endoftext|>"


@functools.lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable unicode characters."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def token_to_unicode(token: bytes) -> str:
    """A token's bytes in GPT-2's byte-to-unicode alphabet (how vocab.json spells it)."""
    table = bytes_to_unicode()
    return "".join(table[b] for b in token)


def _final_merge(token: bytes, rank: int, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The two parts BPE reaches for ``token`` using only merges ranked below ``rank``."""
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best_rank, best_i = None, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < rank and (best_rank is None or r < best_rank):
                best_rank, best_i = r, i
        if best_rank is None:
            raise ValueError(f"token {token!r} (rank {rank}) cannot be built by lower merges")
        parts[best_i : best_i + 2] = [parts[best_i] + parts[best_i + 1]]
    return parts[0], parts[1]


def bpe_ranks() -> dict[bytes, int]:
    """The mergeable tokens of the offline GPT-2 encoding: bytes -> rank (id)."""
    enc = get_tokenizer()
    return {enc.decode_single_token_bytes(i): i for i in range(EOT)}


def vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(vocab.json content, merges in priority order) for tiktoken-style byte ``ranks``."""
    vocab: dict[str, int] = {}
    merges: list[tuple[str, str]] = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        vocab[token_to_unicode(token)] = rank
        if len(token) > 1:
            left, right = _final_merge(token, rank, ranks)
            merges.append((token_to_unicode(left), token_to_unicode(right)))
    return vocab, merges


@functools.lru_cache(maxsize=1)
def gpt2_vocab_and_merges() -> tuple[dict[str, int], tuple[tuple[str, str], ...]]:
    """vocab.json and merges of the offline GPT-2 encoding (computed once, about a second)."""
    vocab, merges = vocab_and_merges(bpe_ranks())
    vocab[EOT_TEXT] = EOT
    return vocab, tuple(merges)


def write_tokenizer_files(out_dir: str | Path, model_max_length: int) -> list[Path]:
    """Write vocab.json, merges.txt, tokenizer_config.json and special_tokens_map.json.

    ``transformers.AutoTokenizer.from_pretrained(out_dir)`` then loads the GPT-2 tokenizer.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab, merges = gpt2_vocab_and_merges()
    files = {
        "vocab.json": json.dumps(vocab, ensure_ascii=False),
        "merges.txt": "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges),
        "special_tokens_map.json": json.dumps(
            {"bos_token": EOT_TEXT, "eos_token": EOT_TEXT, "unk_token": EOT_TEXT}, indent=2
        ),
        "tokenizer_config.json": json.dumps(
            {
                "tokenizer_class": "GPT2Tokenizer",
                "model_max_length": model_max_length,
                "add_prefix_space": False,
                "bos_token": EOT_TEXT,
                "eos_token": EOT_TEXT,
                "unk_token": EOT_TEXT,
                "clean_up_tokenization_spaces": False,
            },
            indent=2,
        ),
    }
    paths = []
    for name, text in files.items():
        path = out / name
        path.write_text(text + ("" if text.endswith("\n") else "\n"), encoding="utf-8")
        paths.append(path)
    return paths
