"""The papers' tables and figures from run directories: ``python -m report RUN... --out DIR``.

``runs`` reads run directories, ``analysis`` computes budgets, curves and speedups against the
published values (docs/published.yaml), ``sections`` assembles the report, ``render`` writes its
Markdown and ``figures`` its plots; ``cli`` is the command line.
"""
