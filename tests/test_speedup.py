"""Speedups with bootstrap intervals (analysis/time_to_loss.py), loss-vs-compute fits
(analysis/compute_fit.py, report/fits.py)
and the CPU scaling study (scripts/scaling_cpu.py) on synthetic data and run directories."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from analysis import compute_fit
from analysis.compute_fit import PowerLaw, fit_power_law
from analysis.time_to_loss import reach, time_to_loss_speedup
from report import cli as report
from report import fits
from report.time_to_loss import cell_text
from scripts import scaling_cpu

# ---- interpolation and speedup cells -----------------------------------------------------------


def test_reach_is_log_linear_between_evaluations():
    x, y = np.array([0.0, 10.0, 100.0]), np.array([4.0, 3.0, 2.0])
    assert reach(x, y, 2.5) == pytest.approx(math.sqrt(10 * 100))  # halfway in log x
    assert reach(x, y, 3.5) == pytest.approx(5.0)  # from x = 0: linear
    assert reach(x, y, 5.0) == 0.0
    assert reach(x, y, 1.0) is None


def curves(loss, seeds: list[float], *, stretch: float = 1.0, steps: int = 50):
    """(grid, seeds x grid): ``loss(tokens * stretch) + offset`` per seed offset."""
    x = np.linspace(0.0, 1e6, steps + 1)
    return x, np.stack([loss(x * stretch) + off for off in seeds])


def decay(t):
    return 3.0 + 7.0 * np.exp(-t / 5e5)  # still falling at the end of the run


def test_speedup_of_a_stretched_curve_and_its_interval():
    rng = np.random.default_rng(1)
    base = curves(decay, list(rng.normal(0, 0.01, 5)))
    other = curves(decay, list(rng.normal(0, 0.01, 5)), stretch=1.5)  # 1.5x faster
    cell = time_to_loss_speedup(base, other, resamples=500)
    assert cell["ratio"] == pytest.approx(1.5, rel=0.05)
    assert cell["interval"] and cell["lo"] <= 1.5 <= cell["hi"] and not cell["within_noise"]
    assert "[" in cell_text(cell, 3.0) and "within noise" not in cell_text(cell, 3.0)
    same = time_to_loss_speedup(base, curves(decay, list(rng.normal(0, 0.01, 5))), resamples=500)
    assert same["within_noise"] and "(within noise)" in cell_text(same, 3.0)


def test_bootstrap_intervals_cover_the_known_speedup():
    """Over many synthetic experiments (8 seeds each, seed noise 0.02) the 90% interval holds
    the true speedup 1.25 in most of them."""
    rng = np.random.default_rng(7)
    covered = 0
    trials = 40
    for _ in range(trials):
        base = curves(decay, list(rng.normal(0, 0.02, 8)))
        other = curves(decay, list(rng.normal(0, 0.02, 8)), stretch=1.25)
        cell = time_to_loss_speedup(base, other, resamples=200, seed=int(rng.integers(1 << 30)))
        covered += cell["lo"] <= 1.25 <= cell["hi"]
    assert covered >= 0.7 * trials


def test_one_seed_has_no_interval_and_says_so():
    base, other = curves(decay, [0.0]), curves(decay, [0.0, 0.01], stretch=2.0)
    cell = time_to_loss_speedup(base, other)
    assert not cell["interval"] and cell["lo"] is None and cell["hi"] is None
    assert cell["ratio"] == pytest.approx(2.0, rel=0.05)
    assert cell_text(cell, 3.0).endswith("(1 seed: no interval)")


def test_not_reached_gives_the_bound():
    base = curves(decay, [0.0, 0.01])
    worse = curves(decay, [0.5, 0.51])  # never gets down to the baseline's best
    cell = time_to_loss_speedup(base, worse)
    assert cell["ratio"] is None and cell["x"] is None
    assert cell["bound"] == pytest.approx(1.0)  # baseline's tokens to L* over its whole run
    assert cell_text(cell, 3.5).startswith("not reached (< 1.00x: more than its whole run")


# ---- power-law fits --------------------------------------------------------------------------


@pytest.mark.parametrize("n", [3, 6])
def test_fit_recovers_a_known_power_law(n):
    truth = PowerLaw(l_inf=2.5, a=4.0e3, alpha=0.3)
    c = np.geomspace(1e12, 1e15, n)
    law = fit_power_law(c, truth.loss(c))
    assert law.l_inf == pytest.approx(2.5, abs=0.01)
    assert law.alpha == pytest.approx(0.3, rel=0.02)
    assert law.loss(3e13) == pytest.approx(truth.loss(3e13), rel=1e-4)


def test_fit_rejects_too_few_points_and_flags_rising_loss():
    with pytest.raises(ValueError, match="3 or more distinct positive compute values"):
        fit_power_law([1e12, 1e12, 2e12], [3.0, 3.0, 2.9])
    assert fit_power_law([1e12, 1e13, 1e14], [3.0, 3.1, 3.2]) is None


def test_effective_speedup_equals_the_closed_form():
    base = PowerLaw(2.0, 30.0, 0.2)
    k = 1.7  # X at C does what the baseline does at k C
    shifted = PowerLaw(2.0, 30.0 * k**-0.2, 0.2)
    for c in (1e10, 1e13, 1e16):
        assert compute_fit.speedup_at(shifted, base, c) == pytest.approx(k, rel=1e-9)
    other = PowerLaw(2.1, 50.0, 0.25)  # above the baseline's L_inf at C
    c = 1e13
    want = (30.0 / (other.loss(c) - 2.0)) ** (1 / 0.2) / c
    assert compute_fit.speedup_at(other, base, c) == pytest.approx(want, rel=1e-9)
    below = PowerLaw(1.0, 1e-9, 0.2)  # below the baseline's L_inf: never reached by it
    assert math.isinf(compute_fit.speedup_at(below, base, c))


def test_fit_speedups_with_one_seed_per_point_say_so():
    base = PowerLaw(2.0, 30.0, 0.2)
    faster = PowerLaw(2.0, 30.0 * 1.5**-0.2, 0.2)
    points = [
        fits.Point(f"w{i}", c, [float(faster.loss(c))]) for i, c in enumerate((1e12, 1e13, 1e14))
    ]
    rows = fits.speedup_rows(points, faster, base, None)
    assert [r["ratio"] for r in rows] == pytest.approx([1.5] * 3)
    section = {
        "baseline": "AdamW",
        "laws": [],
        "note": None,
        "speedups": [{"optimizer": "X", "interval": False, "at": rows}],
    }
    (_, (_, speed_rows)) = fits.fit_tables(section)
    assert all(r[-1] == "1.50x (1 seed per point: no interval)" for r in speed_rows)


@pytest.mark.parametrize("bias", [False, True])
def test_flops_per_token_matches_the_model(bias):
    from model.gpt import GPT, GPTConfig

    cfg = yaml.safe_load(
        (Path(fits.__file__).parent.parent / "configs/model/tiny-64.yaml").read_text()
    )
    cfg["bias"] = bias
    model = GPT(GPTConfig(**cfg))
    assert fits.flops_per_token(cfg) == pytest.approx(model.flops_per_token())
    assert fits.flops_per_token(cfg, 64) == pytest.approx(model.flops_per_token(64))


# ---- the CPU scaling study ---------------------------------------------------------------------

STUDY_OPTIMIZERS = ("adamw", "mars-adamw")
# The synthetic truth: final loss L(C) per optimizer; MARS-AdamW's is AdamW's at 1.3x compute.
TRUTH = {"adamw": PowerLaw(4.0, 2.0e4, 0.35)}
TRUTH["mars-adamw"] = PowerLaw(4.0, 2.0e4 * 1.3**-0.35, 0.35)


def test_every_study_experiment_composes_at_its_width():
    from helpers import compose_config
    from trainer import command_line

    for width in scaling_cpu.WIDTHS:
        for opt in scaling_cpu.OPTIMIZERS:
            typed, plain = command_line.to_typed(
                compose_config(f"experiment=scaling-cpu/w{width}-{opt}")
            )
            assert plain["name"] == f"scaling-cpu/w{width}-{opt}"
            assert typed.model.name == f"tiny-{width}" and typed.model.n_embd == width
            assert typed.model.n_embd // typed.model.n_head == 32 and typed.model.n_layer == 4
            assert typed.optimizer.name == opt and typed.data.name == "sotu"
            assert (typed.max_steps, typed.batch_tokens, typed.seed) == (100, 1024, 1337)


def write_study_run(run: Path, config: dict, *, lr: float, seed: int, noise: float) -> None:
    """One run directory as train.py writes it (config.yaml, metrics.jsonl with train and eval
    records, meta.jsonl, summary.json); its final loss is TRUTH's at its compute plus ``noise``
    (worse away from the best lr), its curve falling to it from 10.8."""
    cfg = {**config, "seed": seed, "out_dir": str(run)}
    cfg["optimizer"] = {**config["optimizer"], "lr": lr}
    steps, batch = cfg["max_steps"], cfg["batch_tokens"]
    compute = fits.flops_per_token(cfg["model"]) * steps * batch
    best_lr = {"adamw": 6e-4, "mars-adamw": 6e-3}[cfg["optimizer"]["name"]]
    final = TRUTH[cfg["optimizer"]["name"]].loss(compute) + noise + abs(math.log(lr / best_lr))
    speed = 3.0e5 / cfg["model"]["n_embd"]  # tokens/s: narrower is faster
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    lines = []
    for step in range(steps + 1):
        rec = {"step": step, "tokens": step * batch, "elapsed_s": 1.0 + step * batch / speed}
        if step and step % 10 == 0:
            lines.append({**rec, "train_loss": 7.0, "lr": lr, "tokens_per_s": speed})
        if step % cfg["eval_every"] == 0:
            val = final + (10.8 - final) * (1 - step / steps) ** 2
            lines.append({**rec, "val_loss": val, "val_ppl": math.exp(val)})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    meta = {"started": "2026-01-01T00:00:00", "host": "vm", "world_size": 1, "device": "cpu"}
    (run / "meta.jsonl").write_text(json.dumps(meta) + "\n")
    summary = {
        "steps": steps,
        "tokens": steps * batch,
        "best_val_loss": final,
        "final_val_loss": final,
        "model": cfg["model"]["name"],
        "optimizer": cfg["optimizer"]["name"],
        "world_size": 1,
    }
    (run / "summary.json").write_text(json.dumps(summary))


def make_study(out: Path) -> None:
    """The study's directory tree (scripts/scaling_cpu.py) for STUDY_OPTIMIZERS: the sweep
    stage (seed 1337, three lrs), then the seed stage at the sweep's best lr."""
    from helpers import compose_config
    from trainer import command_line

    rng = np.random.default_rng(0)
    for width in scaling_cpu.WIDTHS:
        for opt in STUDY_OPTIMIZERS:
            name = f"w{width}-{opt}"
            _, config = command_line.to_typed(compose_config(f"experiment=scaling-cpu/{name}"))
            for text in scaling_cpu.LRS[opt]:
                run = out / "sweep" / name / f"optimizer.lr={text}"
                write_study_run(run, config, lr=float(text), seed=1337, noise=rng.normal(0, 1e-3))
            _, lr = scaling_cpu.best_run(out / "sweep" / name)
            for seed in scaling_cpu.SEEDS:
                run = out / "seeds" / name / f"seed={seed}"
                write_study_run(run, config, lr=lr, seed=seed, noise=rng.normal(0, 1e-3))


def test_the_report_of_the_scaling_study(tmp_path):
    out = tmp_path / "study"
    make_study(out)
    chosen = []
    for width in scaling_cpu.WIDTHS:
        for opt in STUDY_OPTIMIZERS:
            job, lr = scaling_cpu.best_run(out / "sweep" / f"w{width}-{opt}")
            assert lr == {"adamw": 6e-4, "mars-adamw": 6e-3}[opt]  # the best lr of the sweep
            chosen += [job, out / "seeds" / f"w{width}-{opt}"]
    dest = tmp_path / "report"
    assert report.main([*map(str, chosen), "--out", str(dest)]) == 0
    rep = json.loads((dest / "report.json").read_text())
    md = (dest / "report.md").read_text()
    # A speedup table per width, three seeds each side: an interval in every cell.
    assert [s["size"] for s in rep["speedup"]] == ["tiny-64", "tiny-128", "tiny-192"]  # by width
    for s in rep["speedup"]:
        (row,) = s["rows"]
        assert row["optimizer"] == "MARS-approx" and row["n_seeds"] == 3
        for kind in ("tokens", "time"):
            assert row[kind]["interval"] and row[kind]["lo"] is not None
            assert row[kind]["ratio"] > 1.0
    # The fits: AdamW's truth recovered, and MARS-AdamW's effective speedup is about 1.3x.
    (section,) = rep["fits"]
    laws = {f["optimizer"]: f["law"] for f in section["laws"]}
    assert set(laws) == {"AdamW", "MARS-approx"}
    assert laws["AdamW"]["alpha"] == pytest.approx(0.35, rel=0.25)
    (mars,) = section["speedups"]
    assert mars["interval"] and len(mars["at"]) == 3
    for at in mars["at"]:
        assert at["ratio"] == pytest.approx(1.3, rel=0.15)
        assert at["lo"] <= at["ratio"] <= at["hi"]
    assert (dest / "loss_fit_sotu.png").read_bytes()[:4] == b"\x89PNG"
    assert "## Loss against compute: sotu" in md and "effective speedup over AdamW" in md
    assert "`loss_fit_sotu.png`" in md


def test_the_study_command_dry_run(tmp_path, capsys):
    assert scaling_cpu.main(["--dry-run", "--out", str(tmp_path / "s"), "--", "device=cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    sweeps = [ln for ln in lines if "hydra.sweep.dir=" in ln and "/sweep/" in ln]
    seeds = [ln for ln in lines if "seed=1338,1339" in ln]
    assert len(sweeps) == len(seeds) == 15
    assert all(ln.endswith("device=cpu") for ln in sweeps + seeds)
    assert "optimizer.lr=3e-4,6e-4,1.2e-3" in sweeps[0] and "best lr of the sweep" in seeds[0]
    assert sum(" -m report " in ln for ln in lines) == 2


def test_best_run_needs_a_finished_sweep(tmp_path):
    with pytest.raises(SystemExit, match="no finished sweep run"):
        scaling_cpu.best_run(tmp_path)


def test_reports_only_reruns_the_two_reports_of_the_runs_there(tmp_path, monkeypatch):
    out = tmp_path / "study"
    make_study(out)
    monkeypatch.setattr(scaling_cpu, "OPTIMIZERS", STUDY_OPTIMIZERS)
    cmds = []
    monkeypatch.setattr(scaling_cpu, "execute", lambda cmd, dry_run: cmds.append(cmd))
    assert scaling_cpu.main(["--out", str(out), "--reports-only"]) == 0
    assert [c[1:3] for c in cmds] == [["-m", "report"]] * 2  # no train.py
    chosen = cmds[1][3 : cmds[1].index("--out")]
    assert len(chosen) == 2 * len(scaling_cpu.WIDTHS) * len(STUDY_OPTIMIZERS)
    assert str(out / "sweep" / "w64-adamw" / "optimizer.lr=6e-4") in chosen


def test_a_best_lr_at_the_edge_of_the_sweep_is_flagged():
    assert "largest lr swept" in scaling_cpu.edge_note("adamw", 1.2e-3)
    assert "smallest lr swept" in scaling_cpu.edge_note("muon", 1e-2)
    assert scaling_cpu.edge_note("mars-adamw", 6e-3) == ""
