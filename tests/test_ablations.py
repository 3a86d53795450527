"""The ablation sets (configs/experiment/ablation/, ablation-cpu/; docs/ablations.md): every row
composes through Hydra as train.py does it and differs from its set's `mars` row in exactly the
knobs written out here; the launcher runs the set; the report's ablation table on synthetic run
directories with known curves (no training)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import yaml

from helpers import CONFIG_DIR, compose_config
from report import ablations as abl
from report import cli as report
from report.runs import flatten, load_run
from scripts import launch
from trainer import command_line

SETS = {"ablation": ("owt/small", 100_000), "ablation-cpu": ("sotu/tiny", 100)}
# row -> the config values it changes from `mars` (written out here, independently of the files)
KNOBS = {
    "mars": {},
    "gamma0": {"optimizer.gamma": 0.0},
    "gamma0-noclip": {"optimizer.gamma": 0.0, "optimizer.clip": "none"},
    "lr-grid": {},  # the launcher sweeps lr and lr_1d around the centre
    "optimize-1d": {"optimizer.optimize_1d": True},
    "exact": {"optimizer.mode": "exact"},
    "exact-half": {"optimizer.mode": "exact", "max_steps": "half"},
    "clip-global": {"optimizer.clip": "global"},
    "first-plain": {"optimizer.first_step": "plain"},
}
ADAMW_ROWS = ("adamw", "adamw-mars-hparams")  # another optimizer: compared on their own
NOT_COMPARED = {"name", "wandb.group"}  # bookkeeping: names the run


def composed(experiment: str) -> dict:
    typed, plain = command_line.to_typed(compose_config(f"experiment={experiment}"))
    assert typed.name == plain["name"]
    return flatten(plain)


def composed_with(*overrides: str) -> dict:
    return command_line.to_typed(compose_config(*overrides))[1]


@pytest.fixture(scope="module")
def mars():
    return {s: composed(f"{s}/mars") for s in SETS}


def files(set_name: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / "experiment" / set_name).glob("*.yaml"))


def test_both_sets_have_every_row_the_launcher_and_report_know():
    rows = sorted(launch.TABLES["ablation"][1])
    assert files("ablation") == files("ablation-cpu") == rows
    assert sorted(abl.QUESTIONS) == rows == sorted([*KNOBS, *ADAMW_ROWS])


@pytest.mark.parametrize("set_name", SETS)
def test_mars_row_is_the_paper_run(set_name, mars):
    prefix, steps = SETS[set_name]
    paper = composed(f"{prefix}-mars-adamw")
    drop = NOT_COMPARED
    assert {k: v for k, v in mars[set_name].items() if k not in drop} == {
        k: v for k, v in paper.items() if k not in drop
    }
    assert mars[set_name]["max_steps"] == steps and mars[set_name]["name"] == f"{set_name}/mars"


@pytest.mark.parametrize("set_name", SETS)
@pytest.mark.parametrize("row", sorted(KNOBS))
def test_row_differs_from_mars_in_exactly_its_knobs(set_name, row, mars):
    cfg, base = composed(f"{set_name}/{row}"), mars[set_name]
    assert cfg["name"] == f"{set_name}/{row}"
    assert set(cfg) == set(base)
    diff = {k: cfg[k] for k in cfg if k not in NOT_COMPARED and cfg[k] != base[k]}
    want = {k: base["max_steps"] // 2 if v == "half" else v for k, v in KNOBS[row].items()}
    assert diff == want


@pytest.mark.parametrize("set_name", SETS)
def test_adamw_rows(set_name, mars):
    prefix, _ = SETS[set_name]
    base = mars[set_name]
    paper_adamw = composed(f"{prefix}-adamw")
    for row in ADAMW_ROWS:
        cfg = composed(f"{set_name}/{row}")
        rest = {k: v for k, v in cfg.items() if not k.startswith("optimizer.")}
        assert {k: v for k, v in rest.items() if k not in NOT_COMPARED} == {
            k: v
            for k, v in base.items()
            if not k.startswith("optimizer.") and k not in NOT_COMPARED
        }, row
        assert cfg["optimizer.name"] == "adamw"
    hp = composed(f"{set_name}/adamw-mars-hparams")
    for knob in ("lr", "betas", "weight_decay", "eps", "decay_kinds"):
        assert hp[f"optimizer.{knob}"] == base[f"optimizer.{knob}"], knob
    plain = composed(f"{set_name}/adamw")
    assert {k: v for k, v in plain.items() if k.startswith("optimizer.")} == {
        k: v for k, v in paper_adamw.items() if k.startswith("optimizer.")
    }


@pytest.mark.parametrize("set_name", SETS)
def test_every_file_names_its_question_and_source(set_name):
    for row in files(set_name):
        text = (CONFIG_DIR / "experiment" / set_name / f"{row}.yaml").read_text()
        assert text.startswith("# @package _global_") and "docs/ablations.md" in text, row
        if row not in ("mars", "adamw"):
            assert "Question:" in text, row


# ---- the launcher ---------------------------------------------------------------------------


def dry_run(capsys, *argv: str) -> list[str]:
    assert launch.main(["--dry-run", *argv]) == 0
    return [line for line in capsys.readouterr().out.splitlines() if "train.py" in line]


def test_cpu_set_runs_every_row_on_one_cpu_process(capsys, no_gpu):
    lines = dry_run(capsys, "--table", "ablation-cpu")
    assert len(lines) == len(KNOBS) + len(ADAMW_ROWS) - 1 + 8  # lr-grid: 3 x 3 less the centre
    assert all("--nproc_per_node=1 " in line for line in lines)
    grid = [line for line in lines if "experiment=ablation-cpu/lr-grid" in line]
    assert len(grid) == 8 and not any("lr=0.006 optimizer.lr_1d=0.003" in g for g in grid)
    assert any("optimizer.lr=0.012 optimizer.lr_1d=0.0015" in g for g in grid)


def test_equal_compute_row_keeps_half_of_a_shorter_set(capsys, no_gpu, tmp_path):
    lines = dry_run(capsys, "--table", "ablation-cpu", "--runs-dir", str(tmp_path),
                    "--only", "*exact*", "--", "max_steps=20")  # fmt: skip
    half = [line for line in lines if "exact-half" in line]
    assert half[0].endswith("max_steps=20 max_steps=10")  # the last override wins in Hydra
    assert all(line.endswith("max_steps=20") for line in lines if line not in half)
    args = half[0].split("train.py ")[1].split()  # the command as train.py composes it
    assert composed_with(*args)["max_steps"] == 10
    run = tmp_path / "ablation-cpu" / "exact-half"  # finished at its 10 steps: skipped
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"steps": 10}))
    lines = dry_run(capsys, "--table", "ablation-cpu", "--runs-dir", str(tmp_path),
                    "--only", "*exact-half", "--", "max_steps=20")  # fmt: skip
    assert lines and all(line.startswith("# skipped ablation-cpu/exact-half") for line in lines)


def test_gpu_set_is_the_paper_small_run(capsys, no_gpu):
    lines = dry_run(capsys, "--table", "ablation", "--gpus", "8")
    assert len(lines) == 18 and all("--nproc_per_node=8 " in line for line in lines)
    assert all("micro_batch_size=15" in line for line in lines)


# ---- the report -----------------------------------------------------------------------------


def make_run(root: Path, set_name: str, row: str, curve, *, seed: int = 0, steps: int = 100,
             opt: dict | None = None, dirname: str | None = None) -> Path:  # fmt: skip
    """A run of an ablation row: val loss ``curve(step)`` every 10 steps, 1,000 tokens a step."""
    run = root / (dirname or f"{row}-s{seed}")
    run.mkdir(parents=True)
    optimizer = {"name": "mars-adamw", "mode": "approx", "lr": 6e-3, "lr_1d": 3e-3, "gamma": 0.025}
    config = {"name": f"{set_name}/{row}", "model": {"name": "tiny"}, "data": {"name": "sotu"},
              "optimizer": {**optimizer, **(opt or {})}, "seed": seed, "max_steps": steps,
              "batch_tokens": 1000, "out_dir": str(run)}  # fmt: skip
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    lines = []
    for step in range(0, steps + 1, 10):
        lines.append(json.dumps({"step": step, "tokens": step * 1000, "val_loss": curve(step)}))
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (run / "summary.json").write_text(json.dumps({"steps": steps, "tokens": steps * 1000}))
    return run


def falling(end: float):
    return lambda step: 11.0 if step == 0 else end + 1.0 / step


def sections(root: Path) -> list[dict]:
    warnings: list[str] = []
    runs = [load_run(p, [], warnings) for p in sorted(root.iterdir())]
    return abl.ablation_sections(runs, warnings)


def test_rows_delta_spread_and_compute(tmp_path):
    make_run(tmp_path, "ablation-cpu", "mars", falling(3.0))
    make_run(tmp_path, "ablation-cpu", "gamma0", falling(3.2), opt={"gamma": 0.0}, seed=0)
    make_run(tmp_path, "ablation-cpu", "gamma0", falling(3.4), opt={"gamma": 0.0}, seed=1)
    make_run(tmp_path, "ablation-cpu", "exact", falling(2.9), opt={"mode": "exact"})
    make_run(tmp_path, "ablation-cpu", "exact-half", falling(2.95), opt={"mode": "exact"},
             steps=50)  # fmt: skip
    (sec,) = sections(tmp_path)
    rows = {r["label"]: r for r in sec["rows"]}
    assert [r["label"] for r in sec["rows"]] == ["mars", "gamma0", "exact", "exact-half"]
    base = rows["mars"]
    assert base["best"] == pytest.approx(3.01) and base["delta_best"] == 0.0
    assert base["compute"] == 100_000 and base["passes_per_step"] == 1
    g = rows["gamma0"]
    assert g["n_runs"] == 2 and g["seeds"] == ["0", "1"]
    assert g["best"] == pytest.approx(3.31) and g["delta_best"] == pytest.approx(0.3)
    assert g["best_std"] == pytest.approx(statistics.stdev([3.21, 3.41]))
    assert g["changed"] == "gamma=0.0" and g["question"] == abl.QUESTIONS["gamma0"]
    e, h = rows["exact"], rows["exact-half"]
    assert e["compute"] == 200_000 and h["compute"] == 100_000  # two passes a step
    assert e["best"] == pytest.approx(2.91)
    assert e["best_at_base_compute"] == pytest.approx(2.9 + 1 / 50)  # its first 50 steps
    assert h["best_at_base_compute"] == h["best"] == pytest.approx(2.95 + 1 / 50)
    assert e["changed"] == "mode=exact"


def test_lr_grid_rows_are_told_apart_by_their_lrs(tmp_path):
    make_run(tmp_path, "ablation", "mars", falling(3.0))
    for lr, lr_1d in ((0.012, 0.003), (0.003, 0.0015)):
        make_run(tmp_path, "ablation", "lr-grid", falling(3.0 + lr), dirname=f"g{lr}-{lr_1d}",
                 opt={"lr": lr, "lr_1d": lr_1d})  # fmt: skip
    (sec,) = sections(tmp_path)
    assert [r["label"] for r in sec["rows"]] == [
        "mars", "lr-grid lr=0.003 lr_1d=0.0015", "lr-grid lr=0.012 lr_1d=0.003",
    ]  # fmt: skip
    assert sec["rows"][1]["changed"] == "lr=0.003, lr_1d=0.0015"
    make_run(tmp_path, "ablation", "mars", falling(3.5), opt={"eps": 1e-6}, dirname="other")
    warnings: list[str] = []
    (sec,) = abl.ablation_sections([load_run(p, [], warnings) for p in sorted(tmp_path.iterdir())],
                                   warnings)  # fmt: skip
    assert [r["label"] for r in sec["rows"]].count("mars") == 2  # a second baseline: kept, noted
    assert any("2 differing `mars`" in w for w in warnings)


def test_no_baseline_is_a_warning_and_other_runs_are_no_rows(tmp_path):
    make_run(tmp_path, "ablation", "gamma0", falling(3.2), opt={"gamma": 0.0})
    make_run(tmp_path, "owt", "small-adamw", falling(3.3))  # not an ablation set
    warnings: list[str] = []
    runs = [load_run(p, [], warnings) for p in sorted(tmp_path.iterdir())]
    (sec,) = abl.ablation_sections(runs, warnings)
    assert [r["label"] for r in sec["rows"]] == ["gamma0"] and sec["rows"][0]["delta_best"] is None
    assert any("no `mars` run" in w for w in warnings)
    assert abl.ablation_sections(runs[1:], []) == []


def test_python_m_report_prints_the_table_with_its_questions(tmp_path, capsys):
    runs = tmp_path / "runs"
    make_run(runs, "ablation-cpu", "mars", falling(3.0))
    make_run(runs, "ablation-cpu", "first-plain", falling(3.05), opt={"first_step": "plain"})
    assert report.main([str(runs), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "report.md").read_text()
    assert text in capsys.readouterr().out
    assert text.index("## Ablations") < text.index("## Runs")
    assert abl.QUESTIONS["first-plain"] in text and "+0.050" in text
    assert "| first-plain | first_step=plain |" in text
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [r["row"] for r in data["ablations"][0]["rows"]] == ["mars", "first-plain"]
