"""Thin launchers and tools. The Python ones run from the repository root as modules, which puts
the root on the import path without any editing of ``sys.path``:

    python -m scripts.get_eval_data        python -m scripts.sample runs/NAME
    python -m scripts.export_hf RUN OUT    python -m report runs/owt --out reports/owt
    python -m bench.train_step     python -m bench.optim    python -m bench.data

``python -m scripts.launch`` (behind the ``paper_*.sh`` wrappers) reads its runs and sizes from
configs/ through ``bench.configs`` and ``bench.memory_model``.
"""
