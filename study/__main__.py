"""``python -m study``: the optimizer study (study/cli.py, docs/study.md)."""

from study.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
