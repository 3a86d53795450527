"""``python -m study``: the optimizer study (study/cli.py, docs/study.md); ``python -m study
run|publish|compare <study>``: a study defined as data (study/parts.py)."""

import sys

from study import cli, parts

if __name__ == "__main__":
    argv = sys.argv[1:]
    raise SystemExit(parts.main(argv) if argv[:1] and argv[0] in parts.COMMANDS else cli.main(argv))
