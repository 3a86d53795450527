#!/usr/bin/env bash
# The referee's study (docs/study.md, "The referee's study"): every optimizer with the same five
# knobs (lr, aux_lr, wd, beta2, warmup), chosen by the mean over selection seeds 0, 6, 7, judged
# on evaluation seeds 1-5. Run it again to continue; it refuses uncommitted tracked changes.
#
#   scripts/study_referee.sh headline   # proxy-100k at 1x: AdamW (and 2x, 4x), MARS-AdamW, Muon,
#                                       # MARS-M, Moonlight
#   scripts/study_referee.sh factorial  # MARS-AdamW's loss taken apart at its chosen values
#   scripts/study_referee.sh ladder     # three sizes of one shape at 0.25x: every knob tuned at
#                                       # proxy-100k, the lrs at proxy-193k and proxy-423k
#   scripts/study_referee.sh widthinit  # proxy-100k at 0.25x again with a width-aware init
#   scripts/study_referee.sh report     # the headline's results.csv, curves, report.md, figures
#   scripts/study_referee.sh publish    # report, then its files into docs/study/referee/, and
#                                       # every finished run's config, meta, metrics and summary
#                                       # into docs/study/referee/runs/ (a fresh clone continues
#                                       # from them: every mode first restores them into OUT)
#
# OUT (default runs/referee) holds the run directories (OUT-factorial, OUT-ladder... beside it);
# docs/study/referee/ the committed files.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/referee}
JOBS=${JOBS:-2}
OPTS=(adamw mars-adamw muon mars-m moonlight)
# Where each search starts: the earlier 1x study's choices (docs/study/1x), on the lattices;
# the searches move as far as they must.
CENTERS=(
  --center adamw:lr=0.008 --center adamw:aux_lr=0.256
  --center mars-adamw:lr=0.016 --center mars-adamw:aux_lr=0.128
  --center muon:lr=0.032 --center muon:aux_lr=0.016
  --center mars-m:lr=0.032 --center mars-m:aux_lr=0.032
  --center moonlight:lr=0.032 --center moonlight:aux_lr=0.032
)
KEEP=docs/study/referee/runs  # the finished runs' small files, committed
restore() {  # committed finished runs back into OUT (never over a run that is there)
  [ -d "$KEEP" ] || return 0
  (cd "$KEEP" && find . -name summary.json -printf '%h\n') | while read -r d; do
    [ -e "$OUT/runs/$d/summary.json" ] || { mkdir -p "$OUT/runs/$d" && cp "$KEEP/$d"/* "$OUT/runs/$d/"; }
  done
}
keep() {  # every finished run of OUT into KEEP (its four small files; no checkpoints)
  (cd "$OUT/runs" && find . -name summary.json -printf '%h\n') | while read -r d; do
    mkdir -p "$KEEP/$d"
    for f in config.yaml meta.jsonl metrics.jsonl summary.json; do
      [ -f "$OUT/runs/$d/$f" ] && cp "$OUT/runs/$d/$f" "$KEEP/$d/"
    done
  done
}
[ "${1:-headline}" = publish ] || restore
case "${1:-headline}" in
  headline)
    python -m study --out "$OUT" --optimizers "${OPTS[@]}" --models proxy-100k --budgets 1 \
      --reference-budgets 2 4 --jobs "$JOBS" --threads 1 "${CENTERS[@]}" ;;
  factorial)
    python -m study.factorial --from "$OUT/results.csv" --out "$OUT-factorial" --jobs "$JOBS" \
      --threads 1 ;;
  ladder)
    python -m study --out "$OUT-ladder" --optimizers "${OPTS[@]}" --models proxy-100k \
      --budgets 0.25 --reference-budgets 2 4 --jobs "$JOBS" --threads 1 "${CENTERS[@]}"
    python -m study --out "$OUT-ladder-up" --optimizers "${OPTS[@]}" \
      --models proxy-193k proxy-423k --budgets 0.25 --reference-budgets 2 4 --knobs lr aux_lr \
      --center-from "$OUT-ladder/results.csv" --center-cell proxy-100k:0.25 \
      --merge "$OUT-ladder/results.csv" --jobs "$JOBS" --threads 1 ;;
  widthinit)
    # GPT-2's init std 0.02 scaled to GPT-2 small's initial logit scale: 0.02 sqrt(768 / 32)
    python -m study --out "$OUT-widthinit" --optimizers "${OPTS[@]}" --models proxy-100k \
      --budgets 0.25 --reference-budgets 2 4 --jobs "$JOBS" --threads 1 "${CENTERS[@]}" \
      -- model.init_std=0.098 ;;
  report)
    python -m study --out "$OUT" --optimizers "${OPTS[@]}" --models proxy-100k --budgets 1 \
      --reference-budgets 2 4 "${CENTERS[@]}" --report-only ;;
  publish)
    "$0" report
    mkdir -p docs/study/referee
    for f in results.csv curves.csv.gz report.md curves.png study.png started.txt; do
      [ -f "$OUT/$f" ] && cp "$OUT/$f" docs/study/referee/
    done
    keep ;;
  *) echo "usage: $0 headline|factorial|ladder|widthinit|report|publish" >&2; exit 2 ;;
esac
