"""The gradient-statistics predictor scored against what was measured (study/findings/predict.py writes
its records, results/crossover/predict*.json): each measured cell of a scored comparison, the
predicted sign beside the measured one, hit or miss (the crossover's report and
results/crossover/correction.md print the table)."""

from __future__ import annotations

import json
import math
from pathlib import Path


def predictions(results: Path) -> list[dict]:
    """``[{label, step, crossover, snr_passes_1, cosine_positive_from, b_simple}]`` of every
    prediction record in ``results``."""
    out = []
    for path in sorted(results.glob("predict*.json")):
        rec = json.loads(path.read_text())
        for run in rec.get("runs", []):
            for ph in run.get("phases", []):
                out.append({"file": path.name, "label": run.get("label") or run.get("run", ""),
                            "step": ph["step"], "steps": run["steps"],
                            "b_simple": ph["b_simple"], **ph["prediction"]})  # fmt: skip
    return out


# which comparison a prediction run speaks for: the correction acts in MARS-AdamW's trajectory
# (Delta_gamma) and, added to AdamW's configuration, in AdamW's (Delta_corr, study/findings/correction.py)
SCORED = {"Delta_gamma: MARS-AdamW - (gamma = 0)": "mars-adamw",
          "Delta_corr: AdamW + correction - AdamW": "adamw"}  # fmt: skip


def _sign(lo: float, hi: float) -> str:
    return "helps" if hi < 0 else "hurts" if lo > 0 else "no difference"


def scored(preds: list[dict], measured: list[dict]) -> list[dict]:
    """Each measured cell of each scored comparison against each prediction record's run of
    the matching optimizer at its last phase: the correction predicted to help where the batch
    is at or past the predicted crossover; measured to help where the interval lies below 0;
    a hit where both say help or both say it does not (``measured``: rows with ``comparison``,
    ``batch``, ``lo``, ``hi``)."""
    out = []
    for comparison, label in SCORED.items():
        runs = {}
        for p in preds:
            if p["label"] == label and p["step"] >= runs.get(p["file"], {"step": -1})["step"]:
                runs[p["file"]] = p
        for m in (m for m in measured if m["comparison"] == comparison):
            for p in runs.values():
                helps = math.isfinite(p["crossover"]) and m["batch"] >= p["crossover"]
                sign = _sign(m["lo"], m["hi"])
                out.append({"comparison": comparison, "batch": m["batch"], "file": p["file"],
                            "label": label, "step": p["step"], "steps": p["steps"],
                            "predicted": "helps" if helps else "no help", "measured": sign,
                            "hit": helps == (sign == "helps")})  # fmt: skip
    return out


def _b(x: float) -> str:
    return "> ladder" if x == math.inf else "-" if math.isnan(x) else f"{x:,.0f}"


def predicted_lines(preds: list[dict]) -> list[str]:
    """The report's table of every prediction record's phases (or how to make one)."""
    if not preds:
        return ["No prediction record yet (`python -m study predict RUN_DIR --json "
                "results/crossover/predict-NAME.json`)."]  # fmt: skip
    lines = ["| record | run | step | B_simple (tokens) | SNR passes 1 | cosine clearly "
             "positive from | predicted crossover |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for p in preds:
        lines.append(f"| {p['file']} | {p['label']} | {p['step']}/{p['steps']} | "
                     f"{p['b_simple']:,.0f} | {_b(p['snr_passes_1'])} | "
                     f"{_b(p['cosine_positive_from'])} | {_b(p['crossover'])} |")  # fmt: skip
    return lines


def scored_lines(score: list[dict]) -> list[str]:
    """``scored``'s rows as one Markdown table: each measured cell, its record, hit or miss."""
    lines = ["| comparison | batch | record (run, step) | predicted | measured | hit |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for r in score:
        lines.append(f"| {r['comparison']} | {r['batch']:,} | {r['file']} ({r['label']}, "
                     f"{r['step']}/{r['steps']}) | {r['predicted']} | {r['measured']} | "
                     f"{'hit' if r['hit'] else 'miss'} |")  # fmt: skip
    return lines
