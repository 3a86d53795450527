"""What train.py and eval.py share: distributed init (``distributed``), device facts
(``device``), seeding, the training config (``config``), checkpoints, the run directory
(``rundir``) and one run's life in it (``run``: counters, preparation, save and restore, summary),
logging (``logs``) and the training loop's meter (``meter``), validation loss (``evaluation``),
atomic file writes (``files``) and the sweep layout (``sweeps``). Downstream evaluation lives in
``evals/``. Nothing here imports Hydra: the entry points pass plain values down.
"""
