#!/usr/bin/env bash
# The small-scale reproduction on a CPU (89 min measured on a 2-core machine, README): AdamW, Muon, MARS-AdamW, MARS-M and
# Moonlight on a tiny GPT and the embedded corpus (configs/experiment/sotu/), through the same
# experiment, sweep and report path as the paper runs:
#   1. a short learning-rate sweep per optimizer (x0.5, x1, x2 of its GPT-2 small lr), Hydra
#      --multirun, one run after another;
#   2. each optimizer's best lr (lowest best validation loss) again with two more seeds;
#   3. python -m report over the sweep (OUT/sweep-report: every lr tried) and over the chosen
#      runs, 3 seeds each (OUT/report: the tables, speedups and figures).
# Usage: scripts/repro_cpu.sh [OUT (default runs/repro-cpu)] [-- extra overrides for every run]
# Started again, it skips finished runs and resumes interrupted ones.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py=${PYTHON:-python}
out=runs/repro-cpu
if [[ $# -gt 0 && $1 != "--" ]]; then out=$1; shift; fi
[[ ${1:-} == "--" ]] && shift
optimizers=(adamw muon mars-adamw mars-m moonlight)
declare -A lrs=(
  [adamw]=3e-4,6e-4,1.2e-3        # configs/optimizer/adamw.yaml: 6e-4
  [muon]=1e-2,2e-2,4e-2           # muon.yaml: 2e-2
  [mars-adamw]=3e-3,6e-3,1.2e-2   # mars-adamw.yaml: 6e-3
  [mars-m]=3e-3,6e-3,1.2e-2       # mars-m.yaml: 6e-3
  [moonlight]=3e-3,6e-3,1.2e-2    # moonlight.yaml: 6e-3
)
start=$SECONDS
for opt in "${optimizers[@]}"; do
  "$py" train.py --multirun "experiment=sotu/tiny-$opt" "optimizer.lr=${lrs[$opt]}" \
    progress=false "hydra.sweep.dir=$out/sweep/$opt" "$@"
done
chosen=()
for opt in "${optimizers[@]}"; do
  # The sweep job with the lowest best validation loss (summary.json), and its lr.
  best=$("$py" - "$out/sweep/$opt" <<'PY'
import json, sys
from pathlib import Path
runs = [(json.loads((d / "summary.json").read_text())["best_val_loss"], d)
        for d in Path(sys.argv[1]).iterdir() if (d / "summary.json").is_file()]
print(min(runs)[1].name.removeprefix("optimizer.lr="))
PY
)
  echo "best lr for $opt: $best"
  "$py" train.py --multirun "experiment=sotu/tiny-$opt" "optimizer.lr=$best" seed=1338,1339 \
    progress=false "hydra.sweep.dir=$out/seeds/$opt" "$@"
  chosen+=("$out/sweep/$opt/optimizer.lr=$best" "$out/seeds/$opt")
done
"$py" -m report "$out/sweep" --out "$out/sweep-report" --title "CPU reproduction: the sweep"
"$py" -m report "${chosen[@]}" --out "$out/report" --title "Small-scale reproduction (CPU)"
echo "repro_cpu: $(( (SECONDS - start) / 60 )) min in all; report in $out/report"
