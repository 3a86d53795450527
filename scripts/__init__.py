"""Thin launchers: no training logic here, only commands that start or feed the parts above.

    scripts/paper_owt.sh, paper_fineweb.sh, paper_mars_m.sh   a published table's runs (launch.py)
    scripts/repro_cpu.sh                                      the small-scale CPU reproduction
    python -m scripts.get_eval_data                           cache the downstream tasks' data
    python -m scripts.sample runs/NAME                        text from a checkpoint
    python -m scripts.export_hf RUN OUT                       a Hugging Face GPT-2 directory
    python -m scripts.convert_checkpoint RUN/checkpoints/step_N   a DCP checkpoint as one file
    python -m scripts.checksum_cost                           what checkpoint checksums cost

The Python ones run from the repository root as modules, which puts the root on the import path
without any editing of ``sys.path``. ``python -m scripts.launch`` (behind the ``paper_*.sh``
wrappers) reads its runs and sizes from configs/ through ``runtime.config_files`` and
``trainer.memory_plan``. The report is ``python -m report`` (``report/``), the benchmarks
``python -m bench.NAME`` (``bench/``).
"""
