"""``python -m scripts.optimizer_table [--readme README.md]``: the README's table of optimizers,
rendered from the registry (each spec's ``description``, optim/registry.py) and the exact-mode
configs (``configs/optimizer/*-exact.yaml``), so a new optimizer appears there by registering
it. Prints the table; with ``--readme`` rewrites the block between
``<!-- optimizers: python -m scripts.optimizer_table --readme README.md -->`` and
``<!-- end -->`` (tests/test_doc_lists.py keeps it equal)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import optim

ROOT = Path(__file__).resolve().parent.parent
MARK = re.compile(r"(<!-- optimizers: [^\n]*-->\n)(.*?)(<!-- end -->)", re.S)
EXACT = ("exact mode: the reference gradient computed at the current weights (twice the "
         "forward/backward)")  # fmt: skip


def table() -> str:
    """The baselines first, then the MARS family, each by name; the exact-mode configs last."""
    names = sorted(optim.available(), key=lambda n: (n.startswith("mars"), n))
    rows = [f"| `{n}` | {optim.get_spec(n).description} |" for n in names]
    exact = sorted(p.stem for p in (ROOT / "configs" / "optimizer").glob("*-exact.yaml"))
    if exact:
        rows.append(f"| {', '.join(f'`{n}`' for n in exact)} | {EXACT} <!-- every optimizer --> |")
    return "\n".join(["| name | what it is |", "|---|---|", *rows]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.optimizer_table", description=__doc__)
    ap.add_argument("--readme", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.readme is None:
        print(table(), end="")
        return 0
    text = args.readme.read_text()
    if not MARK.search(text):
        raise SystemExit(f"{args.readme}: no block '<!-- optimizers: ... -->' ... '<!-- end -->' "
                         "to rewrite; add the two marker lines where the table goes")  # fmt: skip
    args.readme.write_text(MARK.sub(lambda m: m[1] + table() + m[3], text, count=1))
    print(args.readme)
    return 0


if __name__ == "__main__":
    sys.exit(main())
