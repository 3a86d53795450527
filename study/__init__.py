"""The optimizer study (docs/study.md): a protocol for comparing optimizers that a reviewer
accepts: tuned and bracketed on a selection seed, evaluated on fresh seeds shared by every
optimizer, compared by paired differences and data-equivalent speedups, written as results.csv.
"""
