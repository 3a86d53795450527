#!/usr/bin/env bash
# The first GPU hour in one command (bench/gpu_check.py): the GPU tests and every GPU measurement
# the docs promise, each step under its own time limit, into one Markdown report. No network.
#   scripts/gpu_check.sh [--out runs/gpu_check.md] [--dry-run] [--cpu] [--only STEP...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python}" -m bench.gpu_check "$@"
