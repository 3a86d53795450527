"""Process plumbing shared by train.py and eval.py: distributed init, seeding, checkpoints,
logging and the run directory."""
