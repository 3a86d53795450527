"""The training application behind ``train.py``: the typed run config (``config``), the run's
life in its directory (``run``, ``rundir``), checkpoints in one file or as DCP directories
(``checkpoint``, ``dcp_checkpoint``), the per-step meter and logs (``meter``, ``logs``), the
non-finite and preemption policies (``nonfinite``, ``preemption``), sweeps (``sweeps``),
validation loss (``evaluation``), the memory model that plans a run's micro-batch
(``memory_model``, ``memory_plan``), the checks of the command line before anything slow is
imported (``cli_checks``) and of the composed config (``checks``), and train.py's command line
(``command_line``: Hydra's app, running the run function train.py hands it). It imports
``data/``, ``model/``, ``optim/`` and ``runtime/``; only the entry points and the tools
(``bench/``, ``scripts/``, ``evals/`` for checkpoint loading) import it. Only ``command_line``
imports Hydra: the rest takes plain values.
"""
