"""The analysis layer under both the study (study/) and the report (report/): statistics at one
level (``stats``: Student-t intervals, paired tests, Holm, a bootstrap), the data-equivalent
speedup (``speedup``), and one fixed colour per optimizer for every figure (``colours``).
Imports numpy only: study/ and report/ never import each other and share what is here."""
