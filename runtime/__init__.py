"""The leaf plumbing every part may use: device facts (``device``), distributed init and
collectives (``distributed``), atomic file writes (``files``), seeding (``seeding``), the one door
to a run directory's files (``runfiles``: names, writers, readers, "finished"), the one builder of
``train.py`` command lines (``commands``) and the one reader of configs/ outside Hydra
(``config_files``). It imports nothing of the project: every other part builds on it.
"""
