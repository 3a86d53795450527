"""The analysis layer under both the study (study/) and the report (report/): statistics at one
level (``stats``: Student-t intervals, paired tests, Holm, bootstraps and percentile intervals),
the three speedups each named by its estimator (``speedup``: data-equivalent; ``time_to_loss``;
``compute_fit``: docs/design.md, "speedup"), Markdown tables (``tables``) and one fixed colour
per optimizer for every figure (``colours``). Imports numpy only: study/ and report/ never
import each other and share what is here."""
