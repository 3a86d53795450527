"""python -m report on synthetic run directories with known curves (no training, seconds)."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from evals.tasks import TASKS, paper_average
from report import cli as report
from report.runs import optimizer_label
from report.variants import Published

ROOT = Path(__file__).resolve().parent.parent
# 100 steps of 491.52M tokens = 49.152B tokens: the paper's 100k steps, in 100 records.
PAPER_STEP_TOKENS = 491_520_000


def make_run(
    root: Path,
    name: str,
    curve,
    *,
    optimizer: str = "adamw",
    model: str = "gpt2-small",
    data: str = "openwebtext",
    seed: int = 0,
    max_steps: int = 100,
    steps: int | None = None,
    batch_tokens: int = PAPER_STEP_TOKENS,
    eval_every: int = 10,
    opt: dict | None = None,
    elapsed: bool = True,
    truncate_last: bool = False,
    meta: dict | None = None,
    tokens_per_s: float | None = None,
) -> Path:
    """A run directory: config.yaml, metrics.jsonl with ``curve(step)`` as val_loss every
    ``eval_every`` steps (and ``tokens_per_s`` on train records), meta.jsonl from ``meta``, and
    summary.json when it ran all ``max_steps``."""
    run = root / name
    run.mkdir(parents=True)
    steps = max_steps if steps is None else steps
    config = {
        "name": name,
        "model": {"name": model, "n_layer": 12},
        "data": {"name": data, "dir": f"/data/{data}"},
        "optimizer": {"name": optimizer, "lr": 1e-3, **(opt or {})},
        "seed": seed,
        "max_steps": max_steps,
        "batch_tokens": batch_tokens,
        "out_dir": str(run),
        "log_every": 1,
    }
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    lines = []
    for step in range(0, steps + 1):
        rec = {"step": step, "tokens": step * batch_tokens}
        if elapsed:
            rec["elapsed_s"] = 36.0 * step
        if step:
            speed = {} if tokens_per_s is None else {"tokens_per_s": tokens_per_s}
            lines.append(json.dumps({**rec, "train_loss": 3.0, "lr": 1e-3, **speed}))
        if step % eval_every == 0 and curve(step) is not None:
            lines.append(json.dumps({**rec, "val_loss": curve(step), "val_ppl": 1.0}))
    text = "\n".join(lines) + "\n"
    if truncate_last:
        text += '{"step": 999, "tokens": 12'
    (run / "metrics.jsonl").write_text(text)
    if meta is not None:
        (run / "meta.jsonl").write_text(json.dumps({"started": "2026-01-01", **meta}) + "\n")
    if steps >= max_steps:
        summary = {"steps": steps, "tokens": steps * batch_tokens, "model": model}
        (run / "summary.json").write_text(json.dumps(summary))
    return run


def write_eval_py(run: Path, step: int, scores: dict[str, float]) -> None:
    """eval.py's eval/step_N.json with the given fractions as each task's reported metric."""
    results = {}
    for task, value in scores.items():
        metric = TASKS[task].metric
        other = "acc_norm" if metric == "acc" else "acc"
        results[task] = {
            "n": 100,
            metric: value,
            other: 0.0,
            "metric": metric,
            "split": "validation",
            "paper_split": "validation",
            "limit": None,
        }
    (run / "eval").mkdir(exist_ok=True)
    record = {"checkpoint": "x", "step": step, "results": results}
    (run / "eval" / f"step_{step}.json").write_text(json.dumps(record))


def write_lm_eval(path: Path, scores: dict[str, float], pretrained: str = "x") -> Path:
    """An lm-eval-harness results file (acc,none / acc_norm,none; MMLU with a subject entry)."""
    results = {}
    for task, value in scores.items():
        metric = TASKS[task].metric
        results[task] = {f"{metric},none": value, "acc_stderr,none": 0.01, "alias": task}
    results["mmlu_anatomy"] = {"acc,none": 0.99}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"results": results, "config": {"model_args": f"pretrained={pretrained}"}})
    )
    return path


def run_report(tmp_path: Path, *paths, extra=()) -> tuple[dict, str, Path]:
    out = tmp_path / "report"
    assert report.main([*map(str, paths), "--out", str(out), *extra]) == 0
    return json.loads((out / "report.json").read_text()), (out / "report.md").read_text(), out


def cells(rep: dict, dataset: str, optimizer: str) -> dict:
    section = next(s for s in rep["val_loss"] if s["dataset"] == dataset)
    row = next(r for r in section["rows"] if r["optimizer"] == optimizer)
    return {(c["size"], c["column"]): c for c in row["cells"]}


def linear(start: float, slope: float, offset: float = 0.0):
    return lambda step: start - slope * step + offset


def test_val_loss_table_token_columns_seeds_paper_and_unfinished(tmp_path, capsys):
    runs = tmp_path / "runs"
    # AdamW: 3.9 at step 0 down to 2.9 at step 100; seed 1 is 0.004 higher.
    make_run(runs, "adamw-s0", linear(3.9, 0.01), seed=0)
    make_run(runs, "adamw-s1", linear(3.9, 0.01, 0.004), seed=1)
    # MARS-approx stopped at step 30 (no summary): 5B reached, 20B and 50B not.
    make_run(
        runs, "mars", linear(3.8, 0.01), optimizer="mars-adamw", opt={"mode": "approx"}, steps=30
    )
    make_run(runs, "muon", lambda s: None, optimizer="muon")  # no evaluation at all
    rep, md, out = run_report(tmp_path, runs)
    assert [b["label"] for b in rep["val_loss"][0]["columns"]] == ["5B", "20B", "50B"]
    adamw = cells(rep, "OpenWebText", "AdamW")
    # 5B: the last eval at <= 5e9 tokens is step 10 (4.9B); 20B: step 40; 50B: step 100.
    assert adamw[("small", "5B")]["mean"] == pytest.approx(3.802)
    assert adamw[("small", "20B")]["mean"] == pytest.approx(3.502)
    whole = adamw[("small", "50B")]
    assert whole["mean"] == pytest.approx(2.902)
    assert whole["std"] == pytest.approx(statistics.stdev([2.9, 2.904]))
    assert whole["n_seeds"] == 2 and whole["reached"]
    assert whole["paper"] == 2.885 and not whole["paper_approximate"]  # README beats the plot
    assert whole["diff"] == pytest.approx(0.017)
    assert "2.902 ± 0.003 (paper 2.885, +0.017)" in md
    assert "3.802 ± 0.003 (paper 3.193, +0.609)" in md
    mars = cells(rep, "OpenWebText", "MARS-approx")
    assert mars[("small", "5B")]["reached"] and not mars[("small", "20B")]["reached"]
    assert "3.700 (paper 3.108, +0.592)" in md  # reached: no mark
    assert "3.500* (paper 2.981, +0.519)" in md  # best so far, not reached yet
    assert "3.500* (paper 2.849, +0.651)" in md
    assert cells(rep, "OpenWebText", "Muon")[("small", "50B")]["mean"] is None
    assert "| Muon | – (paper 3.165) |" in md
    assert "MARS: best validation loss, GPT-2 on OpenWebText" in md  # the published table
    assert "| MARS-exact | 3.107 | – | – | 2.980 | – | – | 2.847 | – | – |" in md
    # Unfinished and missing paper runs.
    assert [u["dir"].split("/")[-1] for u in rep["unfinished"]] == ["mars"]
    missing = {(m["size"], m["optimizer"]) for m in rep["missing"]}
    assert ("small", "MARS-exact") in missing and ("small", "Moonlight") in missing
    assert ("medium", "AdamW") in missing and ("small", "AdamW") not in missing
    assert ("small", "OpenAI-Comm.") not in missing
    assert all(m["dataset"] == "OpenWebText" for m in rep["missing"])
    assert "val_loss_openwebtext_small_tokens.png" in {f["file"] for f in rep["figures"]}
    assert "## Validation loss: OpenWebText" in capsys.readouterr().out  # also printed
    # Explicit token columns: 50B includes the whole 49.15B-token run, which counts as reaching it.
    rep, md, _ = run_report(tmp_path / "explicit", runs, extra=["--at-tokens", "5e9,20B,50e9"])
    explicit = cells(rep, "OpenWebText", "AdamW")[("small", "50B")]
    assert explicit["mean"] == pytest.approx(2.902) and explicit["reached"]
    assert "2.902 ± 0.003 (paper 2.885, +0.017)" in md
    with pytest.raises(SystemExit, match="bad token count 'lots'"):
        report.main([str(runs), "--out", str(tmp_path / "x"), "--at-tokens", "5e9,lots"])
    with pytest.raises(SystemExit, match="--budgets is now --at-tokens"):  # renamed: one meaning
        report.main([str(runs), "--out", str(tmp_path / "x"), "--budgets", "5e9"])
    csv_text = (out / "val_loss.csv").read_text()
    assert (
        csv_text.startswith("dataset,size,optimizer,column,column_tokens")
        and "MARS-approx" in csv_text
    )


def test_lr_sweep_variants_and_small_run_token_columns(tmp_path):
    sweep = tmp_path / "sweep"
    for i, (lr, offset) in enumerate([(0.001, 0.3), (0.003, 0.0), (0.01, 0.2)]):
        for seed in (0, 1) if lr == 0.003 else (0,):
            make_run(
                sweep,
                f"job{i}-s{seed}",
                linear(4.0, 0.01, offset + 0.01 * seed),
                optimizer="mars-adamw",
                model="tiny",
                data="sotu",
                seed=seed,
                batch_tokens=2048,
                opt={"lr": lr, "mode": "approx"},
            )
    rep, md, out = run_report(tmp_path, sweep)
    # 100 steps of 2,048 tokens: columns at 10% / 40% / 100% of 204,800 tokens.
    columns = rep["val_loss"][0]["columns"]
    assert [b["label"] for b in columns] == ["0.0205M", "0.0819M", "0.205M"]
    assert [b["tokens"] for b in columns] == [pytest.approx(20480), pytest.approx(81920), None]
    variants = [v for v in rep["variants"] if v["optimizer"] == "MARS-approx"]
    assert sorted(v["variant"] for v in variants) == [
        "optimizer.lr=0.001",
        "optimizer.lr=0.003",
        "optimizer.lr=0.01",
    ]
    chosen = [v for v in variants if v["chosen"]]
    assert len(chosen) == 1 and chosen[0]["keys"] == {"optimizer.lr": 0.003}
    assert chosen[0]["seeds"] == [0, 1] and chosen[0]["best_mean"] == pytest.approx(3.005)
    cell = cells(rep, "sotu", "MARS-approx")[("tiny", "0.205M")]
    assert cell["mean"] == pytest.approx(3.005) and cell["n_seeds"] == 2
    for text in ("optimizer.lr=0.001", "optimizer.lr=0.01", "3.005 ± 0.007", "chosen"):
        assert text in md
    assert rep["missing"] == []  # not a paper dataset
    for name in (
        "report.md",
        "report.json",
        "val_loss.csv",
        "val_loss_sotu_tiny_tokens.png",
        "val_loss_sotu_tiny_time.png",
    ):
        assert (out / name).stat().st_size > 0, name
    assert not (out / "downstream.csv").exists()  # no evaluations
    assert (out / "val_loss_sotu_tiny_tokens.png").read_bytes()[:4] == b"\x89PNG"


def test_speedup_known_ratios(tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, "adamw", linear(4.0, 0.01))  # best 3.0 at step 100
    make_run(runs, "mars", linear(4.0, 0.02), optimizer="mars-adamw")  # 3.0 at step 50
    make_run(runs, "mars-m", linear(4.0, 0.015), optimizer="mars-m")  # 3.0 between 60 and 70
    make_run(runs, "muon", linear(4.0, 0.005), optimizer="muon")  # best 3.5
    rep, md, _ = run_report(tmp_path, runs)
    (s,) = rep["speedup"]
    assert s["baseline"] == "AdamW" and s["best_loss"] == pytest.approx(3.0)
    assert s["tokens_base"] == pytest.approx(100 * PAPER_STEP_TOKENS)
    rows = {r["optimizer"]: r for r in s["rows"]}
    assert rows["MARS-approx"]["tokens"]["ratio"] == pytest.approx(2.0)
    # Between evaluations the loss is interpolated linearly in log tokens: 2/3 of the way from
    # step 60 (3.1) to step 70 (2.95) in log steps.
    mars_m = 60 * (70 / 60) ** (2 / 3)
    assert rows["MARS-M"]["tokens"]["ratio"] == pytest.approx(100 / mars_m)
    assert rows["MARS-M"]["time"]["ratio"] == pytest.approx(100 / mars_m)  # elapsed_s ∝ step
    muon = rows["Muon"]["tokens"]
    assert muon["ratio"] is None and rows["Muon"]["best_loss"] == pytest.approx(3.5)
    assert "| 2.00x (1 seed: no interval) |" in md
    assert "not reached (< 1.00x: more than its whole run; its best 3.500 > L* 3.000)" in md
    # The baseline may also be given as a label.
    rep, _, _ = run_report(tmp_path / "again", runs, extra=["--baseline", "MARS-approx"])
    assert rep["speedup"][0]["baseline"] == "MARS-approx"


def step0_curve(start: float = 4.0, slope: float = 0.005):
    """10.9 at step 0 (the untrained model), then ``start - slope * step``."""
    return lambda step: 10.9 if step == 0 else start - slope * step


def test_token_columns_never_read_the_step0_loss(tmp_path):
    runs = tmp_path / "runs"
    for name in ("adamw", "muon"):  # evals at steps 0, 25, 50, 75, 100 of 2,048 tokens
        make_run(
            runs, name, step0_curve(), optimizer=name, model="tiny", data="sotu",
            batch_tokens=2048, eval_every=25,
        )  # fmt: skip
    rep, md, _ = run_report(tmp_path, runs)
    labels = [b["label"] for b in rep["val_loss"][0]["columns"]]
    for optimizer in ("AdamW", "Muon"):
        first, middle, whole = (cells(rep, "sotu", optimizer)[("tiny", b)] for b in labels)
        assert first["mean"] is None  # 10% = step 10: only the step-0 eval lies below it
        assert middle["mean"] == pytest.approx(3.875)  # 40% = step 40: the step-25 eval ...
        assert middle["early"] and middle["eval_tokens"] == 25 * 2048  # ... marked as early
        assert whole["mean"] == pytest.approx(3.5) and not whole["early"]
    assert "10.900" not in md and "| AdamW |  | 3.875† | 3.500 |" not in md
    assert "| AdamW | 3.875† | 3.500 |" in md  # the first token column, all "–", left out
    assert f"Left out: {labels[0]}, columns that come before the first evaluation" in md
    assert "never a column's" in md and "`†` the last evaluation" in md
    assert all(r["best_val_loss"] == pytest.approx(3.5) for r in rep["runs"])


def test_figure_limits_show_every_point_and_markers(tmp_path, monkeypatch):
    import numpy as np

    from report import figures as figs

    x = np.array([0.0, 25.0, 50.0, 75.0, 100.0])

    def series(label, y, step0):
        y = np.array(y)
        return {"label": label, "x": x, "mean": y, "lo": y, "hi": y, "n_seeds": 1, "step0": step0}

    # A short curve whose first points drop fast: every point is inside the axis.
    low, high, cut = figs.y_limits([series("A", [4.6, 3.9, 3.6, 3.5, 3.45], False)])
    assert low < 3.45 and high > 4.6 and cut == []
    # A step-0 eval (10.9) next to curves around 3.5 is left above the axis, and said so.
    fast = series("AdamW", [10.9, 3.9, 3.6, 3.5, 3.45], True)
    slow = series("Muon", [10.95, 4.2, 3.8, 3.6, 3.5], True)
    low, high, cut = figs.y_limits([fast, slow])
    assert low < 3.45 and 4.2 < high < 10.9 and cut == ["AdamW 10.90", "Muon 10.95"]
    drawn = []

    class Recording(figs.Figure):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            drawn.append(self)

    monkeypatch.setattr(figs, "Figure", Recording)
    caption = figs.plot_val_loss([fast, slow], xlabel="x", title="t", path=tmp_path / "f.png")
    assert caption == "step-0 loss above the axis (not shown): AdamW 10.90, Muon 10.95"
    whole, zoom = drawn[0].axes  # the whole run, and the last 40% zoomed
    assert [line.get_marker() for line in whole.lines] == ["o", "s"]  # one marker per curve
    assert zoom.get_xlim()[0] > 50.0 and zoom.get_ylim()[1] < 3.7
    # In the report: the caption beside the figure.
    runs = tmp_path / "runs"
    make_run(runs, "adamw", step0_curve(), model="tiny", data="sotu", batch_tokens=2048)
    rep, md, _ = run_report(tmp_path, runs)
    assert rep["figures"][0]["caption"] == "step-0 loss above the axis (not shown): AdamW 10.90"
    assert "step-0 loss above the axis (not shown): AdamW 10.90" in md


def test_time_figure_warns_about_machines_and_throughput(tmp_path):
    runs = tmp_path / "runs"
    common = dict(model="tiny", data="sotu", batch_tokens=2048)
    make_run(
        runs, "adamw", linear(4.0, 0.01), tokens_per_s=1000.0,
        meta={"host": "loaded-box", "device": "cuda:0", "world_size": 1}, **common,
    )  # fmt: skip
    make_run(
        runs, "mars", linear(4.0, 0.01), optimizer="mars-adamw", tokens_per_s=2400.0,
        meta={"host": "idle-box", "device": "cuda:0", "world_size": 1}, **common,
    )  # fmt: skip
    rep, md, _ = run_report(tmp_path, runs)
    time_fig = next(f for f in rep["figures"] if f["file"].endswith("_time.png"))
    caveats = "\n".join(time_fig["caveats"])
    assert "different machines" in caveats and "loaded-box/cuda" in caveats
    assert "tokens/s differ 2.4x" in caveats and "AdamW adamw 1,000" in caveats
    assert not next(f for f in rep["figures"] if f["file"].endswith("_tokens.png"))["caveats"]
    assert "Caution, the times may not compare:** tokens/s differ 2.4x" in md
    assert any(
        "time figure sotu tiny: runs made on different machines" in w for w in rep["warnings"]
    )
    assert {r["tokens_per_s"] for r in rep["runs"]} == {1000.0, 2400.0}
    # Same machine, throughput within 1.3x: no caution.
    again = tmp_path / "again"
    for name, opt, speed in (("adamw", "adamw", 1000.0), ("mars", "mars-adamw", 1200.0)):
        make_run(
            again, name, linear(4.0, 0.01), optimizer=opt, tokens_per_s=speed,
            meta={"host": "box", "device": "cuda:0", "world_size": 1}, **common,
        )  # fmt: skip
    rep, md, _ = run_report(tmp_path / "b", again)
    assert all(not f["caveats"] for f in rep["figures"]) and "Caution" not in md


def test_runs_sharing_a_seed_are_one_seed(tmp_path):
    runs = tmp_path / "runs"
    common = dict(model="tiny", data="sotu", batch_tokens=2048)
    for name, seed, procs, offset in (("s0-1proc", 0, 1, 0.0), ("s0-2proc", 0, 2, 0.002)):
        make_run(
            runs, name, linear(4.0, 0.01, offset), seed=seed,
            meta={"host": "h", "device": "cpu", "world_size": procs}, **common,
        )  # fmt: skip
    make_run(runs, "s1", linear(4.0, 0.01, 0.02), seed=1, **common)
    rep, md, _ = run_report(tmp_path, runs)
    (variant,) = rep["variants"]
    assert variant["seeds"] == [0, 1]
    whole = cells(rep, "sotu", "AdamW")[("tiny", "0.205M")]
    assert whole["n_seeds"] == 2  # not 3
    assert whole["mean"] == pytest.approx((3.001 + 3.02) / 2)  # seed 0: the mean of its runs
    assert whole["std"] == pytest.approx(statistics.stdev([3.001, 3.02]))
    (note,) = [w for w in rep["warnings"] if "share seed" in w]
    assert "s0-1proc (1 proc.), s0-2proc (2 proc.) share seed 0" in note
    assert "different numbers of processes" in note and "counted as one seed" in note
    assert "| 0, 1 |" in md
    assert {r["world_size"] for r in rep["runs"] if r["seed"] == 0} == {1, 2}


def test_downstream_eval_py_lm_eval_and_avg(tmp_path):
    runs = tmp_path / "runs"
    full = {t: 0.5 for t in TASKS}
    adamw = make_run(runs, "adamw", linear(3.9, 0.01), data="fineweb-edu-100b")
    write_eval_py(adamw, 100, full)
    mars = make_run(
        runs, "mars", linear(3.8, 0.01), optimizer="mars-adamw", data="fineweb-edu-100b"
    )
    write_eval_py(mars, 100, full)
    write_eval_py(mars, 50, {t: 0.1 for t in TASKS})  # an older step: not used
    lm = write_lm_eval(
        mars / "eval" / "lm_eval" / "hf" / "results_2026-01-01T00-00-00.json",
        {**full, "hellaswag": 0.4, "mmlu": 0.25},
    )
    write_lm_eval(lm.with_name("results_2025-01-01T00-00-00.json"), {"hellaswag": 0.9})  # older
    muon = make_run(runs, "muon", linear(3.8, 0.01), optimizer="muon", data="fineweb-edu-100b")
    write_eval_py(muon, 100, {t: 0.5 for t in TASKS if t != "sciq"})
    # An lm-eval file named on the command line for a model that is none of the runs.
    other = write_lm_eval(tmp_path / "gpt2" / "results_1.json", full, pretrained="gpt2")
    rep, md, out = run_report(tmp_path, runs, other)
    section = next(s for s in rep["downstream"] if s["size"] == "small")
    rows = {r["optimizer"]: r for r in section["rows"] if not r["paper"]}
    assert rows["AdamW"]["scores"]["hellaswag"] == pytest.approx(50.0)
    assert rows["AdamW"]["avg"] == pytest.approx(50.0)
    assert rows["AdamW"]["source"].startswith("eval.py step 100")
    assert rows["MARS-approx"]["scores"]["hellaswag"] == pytest.approx(40.0)  # lm-eval wins
    assert rows["MARS-approx"]["scores"]["mmlu"] == pytest.approx(25.0)  # aggregate entry
    assert rows["MARS-approx"]["source"] == "lm-eval"
    assert rows["MARS-approx"]["avg"] == pytest.approx((7 * 50 + 40 + 25) / 9)
    assert rows["Muon"]["avg"] is None and "sciq" not in rows["Muon"]["scores"]
    paper = {r["optimizer"]: r for r in section["rows"] if r["paper"]}
    assert set(paper) == {"OpenAI-Comm.", "AdamW", "MARS-AdamW"}
    assert paper["MARS-AdamW"]["scores"]["hellaswag"] == 36.91
    assert "| MARS-AdamW (paper) | 52.23 | 27.39 |" in md
    assert "| AdamW | 50.00 |" in md and "| Muon | 50.00 |" in md
    others = next(s for s in rep["downstream"] if s["dataset"].startswith("other"))
    assert others["rows"][0]["optimizer"] == "gpt2"
    assert "hellaswag" in (out / "downstream.csv").read_text()
    # An lm-eval file outside the run that evaluated its hf export belongs to the run.
    elsewhere = write_lm_eval(
        tmp_path / "lm" / "results_9.json", {"hellaswag": 0.3}, pretrained=str(adamw / "hf")
    )
    rep, _, _ = run_report(tmp_path / "b", runs, elsewhere)
    rows = {r["optimizer"]: r for r in rep["downstream"][0]["rows"] if not r["paper"]}
    assert rows["AdamW"]["scores"]["hellaswag"] == pytest.approx(30.0)
    assert "lm-eval (1 tasks)" in rows["AdamW"]["source"]


def test_a_tenth_task_keeps_the_papers_average(tmp_path, monkeypatch):
    """A task registered in evals/tasks.py outside the paper's average gets a column; the Avg of
    our rows and of the published rows stays the mean of the nine."""
    import evals.tasks as et

    nine = {t: 0.5 for t in TASKS}
    extra = et.Task("lambada", "LAMBADA", et.boolq, "acc", "test", "test", "x", False)
    monkeypatch.setitem(et.TASKS, "lambada", extra)
    runs = tmp_path / "runs"
    adamw = make_run(runs, "adamw", linear(3.9, 0.01), data="fineweb-edu-100b")
    write_eval_py(adamw, 100, nine)  # the nine only: lambada not evaluated
    mars = make_run(runs, "mars", linear(3.8, 0.01), optimizer="mars-adamw", data="fineweb-edu")
    write_lm_eval(mars / "eval" / "results_1.json", {**nine, "lambada": 0.9})
    rep, md, out = run_report(tmp_path, runs)
    rows = {(r["optimizer"], r["paper"]): r for r in rep["downstream"][0]["rows"]}
    assert rows[("AdamW", False)]["avg"] == pytest.approx(50.0)
    assert rows[("MARS-approx", False)]["avg"] == pytest.approx(50.0)  # lambada not averaged
    assert rows[("MARS-approx", False)]["scores"]["lambada"] == pytest.approx(90.0)
    assert rows[("AdamW", True)]["avg"] == 45.72 and rows[("MARS-AdamW", True)]["avg"] == 45.93
    assert "| SciQ | LAMBADA | Avg | source |" in md
    assert (
        "| AdamW (paper) | 51.43 | 26.54 | 55.78 | 36.26 | 30.60 | 64.53 | 50.36 | 24.49 | "
        "71.50 | – | 45.72 |" in md
    )
    assert "LAMBADA are shown but not averaged" in md
    assert "lambada" in (out / "downstream.csv").read_text().splitlines()[0]


def test_published_downstream_without_our_evals(tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, "xl", linear(3.9, 0.01), model="gpt2-xl", data="fineweb-edu", steps=20)
    rep, md, out = run_report(tmp_path, runs)
    assert "## Downstream: FineWeb-Edu XL" in md
    assert "| MARS-AdamW (paper) | 66.54 | 39.85 |" in md and "| AdamW (paper) |" in md
    assert not (out / "downstream.csv").exists()  # no downstream result of ours
    assert "3.700* (paper ≈2.421, +1.279)" in md  # XL 50B from the MARS-M plot readings
    missing = {(m["size"], m["optimizer"]) for m in rep["missing"]}
    assert ("xl", "MARS-approx") in missing and ("small", "AdamW") in missing


def test_published_yaml_is_consistent():
    pub = Published.load(ROOT / "docs" / "published.yaml")
    assert pub.val_loss("OpenWebText", "small", "MARS-exact", "5B")["value"] == 3.107
    assert pub.val_loss("OpenWebText", "large", "MARS-M (γ=0.01)", "50B")["approximate"]
    assert pub.val_loss("FineWeb-Edu", "xl", "Moonlight", "50B")["value"] == 2.393
    for size in ("small", "xl"):
        for row in pub.downstream("FineWeb-Edu", size)["rows"]:
            mean = paper_average(row["scores"])
            assert math.isclose(mean, row["scores"]["avg"], abs_tol=0.011), row["label"]


def test_labels():
    assert optimizer_label({"name": "mars-adamw", "mode": "exact"}) == "MARS-exact"
    assert optimizer_label({"name": "mars-adamw", "mode": "approx"}) == "MARS-approx"
    assert optimizer_label({"name": "mars-m", "gamma": 0.025}) == "MARS-M"
    assert optimizer_label({"name": "mars-m", "gamma": 0.01}) == "MARS-M (γ=0.01)"
    assert optimizer_label({"name": "mars-lion", "mode": "exact"}) == "mars-lion-exact"
    assert optimizer_label({"name": "moonlight"}) == "Moonlight"


def test_bad_paths_truncated_metrics_and_missing_elapsed(tmp_path):
    with pytest.raises(SystemExit, match="nope-run"):
        report.main([str(tmp_path / "nope-run"), "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="matches no file"):
        report.main([str(tmp_path / "runs-*"), "--out", str(tmp_path / "o")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no runs found"):
        report.main([str(tmp_path / "empty"), "--out", str(tmp_path / "o")])
    runs = tmp_path / "runs"
    make_run(runs, "a", linear(3.9, 0.01), steps=50, truncate_last=True)
    make_run(runs, "b", linear(3.9, 0.01), optimizer="muon", elapsed=False)
    (tmp_path / "other").mkdir()
    rep, md, out = run_report(tmp_path, str(runs / "*"), tmp_path / "other")
    assert {r["dir"].split("/")[-1] for r in rep["runs"]} == {"a", "b"}
    run_a = next(r for r in rep["runs"] if r["dir"].endswith("a"))
    assert run_a["steps"] == 50 and run_a["status"] == "unfinished"
    warnings = "\n".join(rep["warnings"])
    assert "not a run directory" in warnings and "other" in warnings
    assert "has no elapsed_s" in warnings  # the time figure leaves run b out and says so
    assert "line" not in warnings  # the truncated last line is no problem


def test_cli_subprocess(tmp_path):
    make_run(
        tmp_path / "runs", "adamw", linear(3.9, 0.01), model="tiny", data="sotu", batch_tokens=2048
    )
    out = tmp_path / "rep"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "report",
            str(tmp_path / "runs"),
            "--out",
            str(out),
            "--title",
            "Smoke",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("# Smoke")
    assert (out / "val_loss_sotu_tiny_tokens.png").stat().st_size > 0


def test_report_and_task_metadata_import_without_torch():
    """The report reads task metadata from evals/tasks.py; that chain must not pull in torch."""
    code = "import sys, report.cli, evals.tasks; sys.exit('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr or "importing the report imported torch"
