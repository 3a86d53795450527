#!/usr/bin/env bash
# Install the project's requirements on a node without network, from the folder that
# scripts/offline_wheels.sh filled, keeping the node's own CUDA torch (docs/offline-install.md).
#
#   scripts/offline_install.sh [--dir wheels] [--dev] [--target DIR]
#
# Reads nothing but the folder (--no-index). With --target, installs into DIR (add it to
# PYTHONPATH) instead of the active environment, for images whose environment is read-only.
# Ends with the GPU check's import check: one line per package still missing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir=wheels dev=0 target=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dir) dir="$2"; shift 2 ;;
    --dev) dev=1; shift ;;
    --target) target=(--target "$2"); export PYTHONPATH="$2${PYTHONPATH:+:$PYTHONPATH}"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "offline_install: unknown argument '$1'; see --help" >&2; exit 2 ;;
  esac
done
py="${PYTHON:-python3}"
if [[ ! -d "$dir" ]]; then
  echo "offline_install: no folder $dir; fill it where there is network:" \
       "scripts/offline_wheels.sh --dir $dir --python-version X.Y" >&2
  exit 2
fi
reqs="$(mktemp)"
files=("$root/requirements.txt")
[[ $dev -eq 1 ]] && files+=("$root/requirements-dev.txt")
grep -hv -E '^\s*(#|-r|$)|^torch([=<>~! ;]|$)' "${files[@]}" > "$reqs"
"$py" -c 'import torch' 2>/dev/null || echo "offline_install: no torch here; install the node's CUDA build first" >&2
"$py" -m pip install -q --no-index --find-links "$dir" "${target[@]}" -r "$reqs"
rm -f "$reqs"
cd "$root" && PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" "$py" -m bench.preflight
