#!/usr/bin/env bash
# The first GPU hour in one command (bench/gpu_check.py): the GPU tests and every GPU measurement
# the docs promise, each step under its own time limit, into one Markdown report. No network.
#   scripts/gpu_check.sh [--out runs/gpu_check.md] [--dry-run] [--cpu] [--only STEP...]
#   scripts/gpu_check.sh --plan quarter [--part 1|2] [--records DIR]   # the 15-minute check
# Where the import check finds a package missing and WHEELS (default .whl) is a folder of wheels
# (scripts/offline_wheels.sh --gpu-check --dir .whl: 22 wheels, 37 MB for Python 3.12), they are
# installed from it first, offline (docs/offline-install.md).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
py="${PYTHON:-python}"
wheels="${WHEELS:-$root/.whl}"
if [[ -d "$wheels" ]] && ! "$py" -m bench.preflight > /dev/null 2>&1; then
  reqs=$(cd "$root" && "$py" -c 'from bench.preflight import missing
print(" ".join(d for _, d, _ in missing() if d != "torch"))' 2>/dev/null || true)
  if [[ -n "$reqs" ]]; then
    echo "gpu_check: installing from $wheels: $reqs"
    # shellcheck disable=SC2086  (the names: one word each)
    "$py" -m pip install -q --no-index --find-links "$wheels" $reqs || true
  fi
fi
exec "$py" -m bench.gpu_check "$@"
