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
#                                       # (ladder-base, then ladder-up: the two halves alone)
#   scripts/study_referee.sh widthinit  # proxy-100k at 0.25x again with a width-aware init
#   scripts/study_referee.sh batch      # MARS-AdamW and AdamW tuned anew at a batch of 8,192 bytes
#   scripts/study_referee.sh all        # headline, ladder-base, widthinit, ladder-up, batch in turn
#   scripts/study_referee.sh report [PART ...]   # results.csv, curves, report.md, figures of
#                                       # every part run (or of the parts named: headline,
#                                       # factorial, ladder, ladder-up, widthinit, batch)
#   scripts/study_referee.sh compare    # the published parts side by side (python -m study.compare):
#                                       # results/referee/compare/{budget,init,sizes,batch}.md
#                                       # (and .png): does each pair's order hold across them?
#   scripts/study_referee.sh publish [PART ...]  # report, then each part's files into
#                                       # results/referee/<part>/ (the headline's: headline/): its
#                                       # ledger, curves, report and figures (every mode first
#                                       # restores the ledgers into OUT: a fresh clone continues)
#
# OUT (default runs/referee) holds the run directories (OUT-factorial, OUT-ladder, OUT-ladder-up,
# OUT-widthinit, OUT-batch beside it); results/referee/<part>/ the committed files: each part's
# ledger (results.csv, curves.csv.gz) from which a fresh clone continues it, its report and figures.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/referee}
JOBS=${JOBS:-2}
OPTS=(adamw mars-adamw muon mars-m moonlight)
# Where each search starts: the earlier 1x study's choices (results/superseded/1x), on the lattices;
# the searches move as far as they must.
CENTERS=(
  --center adamw:lr=0.008 --center adamw:aux_lr=0.256
  --center mars-adamw:lr=0.016 --center mars-adamw:aux_lr=0.128
  --center muon:lr=0.032 --center muon:aux_lr=0.016
  --center mars-m:lr=0.032 --center mars-m:aux_lr=0.032
  --center moonlight:lr=0.032 --center moonlight:aux_lr=0.032
)
DOCS=results/referee  # the committed files: each part in DOCS/<part>/, the headline's in DOCS/headline/
PARTS=(factorial ladder ladder-up widthinit batch)  # run directories OUT-<part>, files DOCS/<part>/
restore_from() {  # a part's committed ledger ($1) into its study folder ($2), never over one there:
  # the study then knows every run the ledger holds as finished (study/ledger.py)
  local f
  [ -d "$1" ] || return 0
  mkdir -p "$2"
  for f in results.csv curves.csv.gz started.txt; do
    [ ! -f "$1/$f" ] || [ -f "$2/$f" ] || cp "$1/$f" "$2/$f"
  done
}
restore() {
  restore_from "$DOCS/headline" "$OUT"
  for part in "${PARTS[@]}"; do restore_from "$DOCS/$part" "$OUT-$part"; done
}
# Each study of the script, with the options that follow (--jobs, or --report-only).
headline() {
  python -m study --out "$OUT" --optimizers "${OPTS[@]}" --models proxy-100k --budgets 1 \
    --reference-budgets 2 4 "${CENTERS[@]}" "$@"
}
factorial() { python -m study.factorial --from "$OUT/results.csv" --out "$OUT-factorial" "$@"; }
ladder() {
  python -m study --out "$OUT-ladder" --optimizers "${OPTS[@]}" --models proxy-100k \
    --budgets 0.25 --reference-budgets 2 4 "${CENTERS[@]}" "$@"
}
ladder_up() {  # from the committed first rung (complete), so this part runs alone in a fresh clone
  python -m study --out "$OUT-ladder-up" --optimizers "${OPTS[@]}" \
    --models proxy-193k proxy-423k --budgets 0.25 --reference-budgets 2 4 --knobs lr aux_lr \
    --center-from "$DOCS/ladder/results.csv" --center-cell proxy-100k:0.25 \
    --merge "$DOCS/ladder/results.csv" --no-swap "$@"  # the seed-set swap: headline cells only
}
widthinit() {
  # GPT-2's init std 0.02 scaled to GPT-2 small's initial logit scale: 0.02 sqrt(768 / 32).
  # Every knob tuned anew; the searches start at the default-init twin's choices (the ladder's
  # proxy-100k cell, committed: a fresh clone runs this part alone) and move as far as they must.
  python -m study --out "$OUT-widthinit" --optimizers "${OPTS[@]}" --models proxy-100k \
    --budgets 0.25 --reference-budgets 2 4 --center-from "$DOCS/ladder/results.csv" \
    --center-cell proxy-100k:0.25 "$@" -- model.init_std=0.098
}
batch() {
  # MARS-AdamW against AdamW with both tuned anew at four times the batch (8,192 bytes, the same
  # bytes in a quarter of the steps): the factorial's untuned batch switch left this open. The
  # searches start from the headline's choices (committed), and move as far as they must.
  python -m study --out "$OUT-batch" --optimizers adamw mars-adamw --models proxy-100k \
    --budgets 1 --reference-budgets --batch-tokens 8192 --center-from "$DOCS/headline/results.csv" \
    --center-cell proxy-100k:1 "$@"
}
RUN=(--jobs "$JOBS" --threads 1)
ran() { [ -f "$1/results.csv" ] || [ -d "$1/runs" ]; }  # a part's ledger or its run directories
compare() {  # from the published files (DOCS), the comparisons whose parts have results
  local dst=$DOCS/compare
  mkdir -p "$dst"
  one() {  # NAME LABEL=CSV[@CELL] ...: only when every file is there
    local name=$1 src; shift
    for src in "$@"; do src=${src#*=}; [ -f "${src%@*}" ] || return 0; done
    python -m study.compare "$@" --out "$dst/$name.md" --figure "$dst/$name.png"
  }
  one budget 0.25x="$DOCS/ladder/results.csv@proxy-100k:0.25" 1x="$DOCS/headline/results.csv@proxy-100k:1"
  one init default="$DOCS/ladder/results.csv@proxy-100k:0.25" \
    width-aware="$DOCS/widthinit/results.csv@proxy-100k:0.25"
  one sizes ladder="$DOCS/ladder-up/results.csv"
  one batch 2048="$DOCS/headline/results.csv@proxy-100k:1" 8192="$DOCS/batch/results.csv@proxy-100k:1"
}
case "${1:-headline}" in publish|compare) ;; *) restore ;; esac
case "${1:-headline}" in
  headline) headline "${RUN[@]}" ;;
  factorial) factorial "${RUN[@]}" ;;
  ladder) ladder "${RUN[@]}" && ladder_up "${RUN[@]}" ;;
  ladder-base) ladder "${RUN[@]}" ;;
  ladder-up) ladder_up "${RUN[@]}" ;;
  all)  # everything, the issue's parts first: the headline, the ladder's proxy-100k cell (the
    # default-init twin of widthinit), widthinit, the larger sizes' comparison cells (no AdamW
    # reference budgets yet), the batch (hours: MARS-AdamW's open question, beyond the
    # factorial's one untuned batch run), then the larger sizes' AdamW 0.5x and 1x (the speedups)
    headline "${RUN[@]}" && ladder "${RUN[@]}" && widthinit "${RUN[@]}" \
      && ladder_up "${RUN[@]}" --reference-budgets && batch "${RUN[@]}" && ladder_up "${RUN[@]}" ;;
  widthinit) widthinit "${RUN[@]}" ;;
  batch) batch "${RUN[@]}" ;;
  report)  # every part named (default: every part) that has run: results.csv, curves, report.md
    shift; parts=("$@"); [ ${#parts[@]} -gt 0 ] || parts=(headline "${PARTS[@]}")
    for part in "${parts[@]}"; do
      case $part in
        headline) headline --report-only ;;
        factorial) ! ran "$OUT-factorial" || factorial --report-only ;;
        ladder) ! ran "$OUT-ladder" || ladder --report-only ;;
        ladder-up) ! ran "$OUT-ladder-up" || ladder_up --report-only ;;
        widthinit) ! ran "$OUT-widthinit" || widthinit --report-only ;;
        batch) ! ran "$OUT-batch" || batch --report-only ;;
        *) echo "$0: no part $part (headline ${PARTS[*]})" >&2; exit 2 ;;
      esac
    done ;;
  publish)  # report, then each part's ledger, curves, report and figures into DOCS/<part>/ (the
    # parts named only: a run tree that ran some parts publishes those, never an older copy)
    shift; parts=("$@"); [ ${#parts[@]} -gt 0 ] || parts=(headline "${PARTS[@]}")
    "$0" report "${parts[@]}"
    for part in "${parts[@]}"; do
      src=$OUT dst=$DOCS/headline
      [ "$part" = headline ] || { src=$OUT-$part; dst=$DOCS/$part; }
      [ -f "$src/results.csv" ] || continue
      mkdir -p "$dst"
      for f in results.csv curves.csv.gz report.md factorial.md curves.png study.png started.txt; do
        [ ! -f "$src/$f" ] || cp "$src/$f" "$dst/"
      done
    done ;;
  compare) compare ;;
  *) echo "usage: $0 headline|factorial|ladder|ladder-base|ladder-up|widthinit|batch|all|report|publish|compare" >&2
     exit 2 ;;
esac
