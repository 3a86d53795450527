#!/usr/bin/env bash
# Train the MARS paper's OpenWebText table: GPT-2 small/medium/large x AdamW, Muon, MARS-AdamW,
# plus MARS-AdamW exact on small (10 runs).
# torchrun on this machine's GPUs, on several nodes (--nodes/--node-rank/--rdzv) or through
# Slurm (--slurm); finished runs are skipped, so re-run it to resume. See python -m scripts.launch --help.
#   scripts/paper_owt.sh --dry-run [options] [-- hydra overrides...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python}" -m scripts.launch --table owt "$@"
