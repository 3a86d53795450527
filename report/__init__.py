"""The papers' tables and figures from run directories: ``python -m report RUN... --out DIR``.

``runs`` reads run directories (task metadata from ``evals/tasks.py``), ``conditions`` where and
how fast each ran, ``published`` the published values (docs/published.yaml), ``variants``
computes variants, seeds, token columns and curves, ``time_to_loss`` the time-to-loss speedups
(the baseline's tokens or seconds to its best loss over an optimizer's), ``fits`` the
loss-against-compute fits and their compute-fit speedups, ``sections`` assembles the report,
``render`` writes its Markdown and ``figures`` its plots; ``cli`` is the command line. Every
interval, bootstrap and speedup is analysis/'s (each speedup named by its estimator), every
Markdown table ``analysis.tables.markdown_table``. See docs/report.md.
"""
