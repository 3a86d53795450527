"""Downstream evaluation, the part of ``eval.py`` that training never runs.

Modules: ``tasks`` (the paper's zero-shot tasks: prompts, choices, metrics, the printed table),
``scoring`` (log-likelihood scoring with lm-evaluation-harness's rules), ``data`` (the tasks'
data cache that ``scripts/get_eval_data.py`` fills), ``loading`` (a trained model from a
checkpoint, a run directory or a Hugging Face directory; also used by ``scripts/sample.py`` and
``scripts/export_hf.py``), ``config`` (eval.py's typed config). Validation loss is shared with
training and lives in ``trainer/evaluation.py``.
"""
