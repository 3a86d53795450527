"""The code of the study's findings (docs/design.md): each module here answers one finding, or is
an instrument of one: the batch crossover (``crossover``, ``crossover_report``), the correction's
anatomy (``correction``, ``correction_tables``), the predictor and its score (``predict``,
``gradstats``, ``prediction_score``), the probe of MARS's correction (``vr_probe``), the one
family of tests (``family``), MARS-AdamW's factorial (``factorial``) and the proxy's speed
(``proxy_speed``).

They stand on the protocol (``study/``: plan, tuner, runner, ledger, results, tables, ...), which
never imports them, except its three doors: ``study/__main__.py`` (``SUBCOMMANDS``, by name),
``study/parts.py`` (its table writers, a factorial part) and ``study/part_readme.py``
(tests/test_layout.py). A new finding's code goes here, with its row in ``SUBCOMMANDS``.
"""
