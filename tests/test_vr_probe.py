"""study.findings.vr_probe: the correction's inflation, on paper and replayed from a finished run."""

from __future__ import annotations

import json

import pytest

from study.findings import vr_probe
from tests.helpers import FAST, compose_config


def test_the_inflation_formula_at_its_known_points() -> None:
    k = 0.025 * 0.95 / 0.05  # MARS's defaults: 0.475
    assert vr_probe.predicted_inflation(k, 0.0) == pytest.approx(1.475**2 + 0.475**2)  # 2.40
    assert vr_probe.predicted_inflation(k, 1.0) == pytest.approx(1.0)
    assert vr_probe.predicted_inflation(k, -1.0) == pytest.approx(1.95**2)  # 3.80
    assert vr_probe.predicted_inflation(0.0, 0.3) == 1.0  # no correction, no inflation


def test_a_finished_run_replays_to_the_last_bit_with_its_figures(tmp_path, sotu_dir) -> None:
    import train
    from trainer import command_line

    out = tmp_path / "run"
    overrides = [*FAST, f"data.dir={sotu_dir}", "optimizer=mars-adamw", "max_steps=8", "seed=3"]
    typed, as_dict = command_line.to_typed(compose_config(*overrides, f"out_dir={out}"))
    train.train(typed, as_dict)
    meta = out / "meta.jsonl"  # the command as train.py's command line records it
    first = json.loads(meta.read_text().splitlines()[0])
    meta.write_text(
        json.dumps({**first, "argv": ["train.py", *overrides, f"out_dir={out}"]}) + "\n"
    )

    r = vr_probe.replay(out)
    trainer = r.pop("trainer")
    assert r["kappa"] == pytest.approx(0.475)
    assert r["replay_steps_checked"] == 8 and r["replay_max_loss_diff"] == 0.0
    assert len(r["windows"]) == 4  # steps 2-8 (the first step has no previous gradient)
    for w in r["windows"]:
        assert 0.0 < w["inflation"] < 3.81 and -1.0 <= w["rho"] <= 1.0
    fixed = vr_probe.fixed_weights(trainer, [128, 256], r["kappa"])
    for f in fixed:
        assert -1.0 <= f["rho"] <= 1.0
        assert f["predicted_inflation"] == pytest.approx(
            vr_probe.predicted_inflation(0.475, f["rho"])
        )
    with pytest.raises(SystemExit, match="not a multiple of a micro-batch"):
        vr_probe.fixed_weights(trainer, [100], r["kappa"])


def test_a_folder_that_is_no_finished_run_is_refused(tmp_path) -> None:
    with pytest.raises(SystemExit, match="is not a finished train.py run"):
        vr_probe.main([str(tmp_path)])


def test_kappa_of_each_optimizer_family() -> None:
    from types import SimpleNamespace as NS

    assert vr_probe.kappa_of(NS(optimizer=NS(name="adamw", betas=[0.9, 0.95]))) == 0.0
    mars = NS(optimizer=NS(name="mars-adamw", gamma=0.025, betas=[0.95, 0.99]))
    assert vr_probe.kappa_of(mars) == pytest.approx(0.475)
    marsm = NS(optimizer=NS(name="mars-m", gamma=0.025, momentum=0.95))
    assert vr_probe.kappa_of(marsm) == pytest.approx(0.475)
    with pytest.raises(SystemExit, match="give the correction's --kappa"):
        vr_probe.kappa_of(NS(optimizer=NS(name="odd", gamma=0.025)))
