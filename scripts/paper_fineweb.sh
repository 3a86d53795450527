#!/usr/bin/env bash
# Train the MARS paper's FineWeb-Edu tables: GPT-2 small and XL x AdamW, MARS-AdamW (4 runs).
# torchrun on this machine's GPUs, on several nodes (--nodes/--node-rank/--rdzv) or through
# Slurm (--slurm); finished runs are skipped, so re-run it to resume. See python -m scripts.launch --help.
#   scripts/paper_fineweb.sh --dry-run [options] [-- hydra overrides...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python}" -m scripts.launch --table fineweb "$@"
