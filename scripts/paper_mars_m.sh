#!/usr/bin/env bash
# Train the MARS-M figures: AdamW, Moonlight and MARS-M (gamma 0.025 and 0.01) on OpenWebText
# (small/medium/large) and FineWeb-Edu (small, XL) (20 runs).
# torchrun on this machine's GPUs, on several nodes (--nodes/--node-rank/--rdzv) or through
# Slurm (--slurm); finished runs are skipped, so re-run it to resume. See python -m scripts.launch --help.
#   scripts/paper_mars_m.sh --dry-run [options] [-- hydra overrides...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python}" -m scripts.launch --table mars-m "$@"
