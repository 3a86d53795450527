"""``python -m report RUN_DIR... --out DIR``: the papers' tables and figures (report/cli.py)."""

import sys

from report.cli import main

sys.exit(main())
