"""The leaf plumbing every part may use: device facts (``device``), distributed init and
collectives (``distributed``), atomic file writes (``files``) and seeding (``seeding``). It imports
nothing of the project: ``data/``, ``model/``, ``evals/`` and ``trainer/`` build on it.
"""
