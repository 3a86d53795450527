"""The batch crossover's estimators (study/findings/gradstats.py) on planted problems with known answers,
and the fixed-step sweep's cells (study/studies/crossover.yaml, run by study/parts.py)."""

import math

import pytest
import torch

from study import definition as defs
from study.findings import gradstats
from study.findings.crossover import budget_of
from study.plan import block_params, budget_steps


class NoisyQuadratic:
    """F(x) = 1/2 sum h_i x_i^2; a gradient on b tokens is ``H x + sigma z / sqrt(b)`` (z
    standard normal): tr(Sigma) = sigma^2 d per token, |G|^2 = |H x|^2. Two common batches are
    two fixed noise draws (the same batch read at different weights)."""

    def __init__(self, d=200, sigma=1.0, seed=0):
        self.gen = torch.Generator().manual_seed(seed)
        self.h = torch.linspace(0.5, 2.0, d, dtype=torch.float64)
        self.x = torch.randn(d, generator=self.gen, dtype=torch.float64)
        self.sigma, self.d = sigma, d
        self.common_noise = [self.noise(4096) for _ in range(2)]

    def noise(self, b):
        return self.sigma * torch.randn(self.d, generator=self.gen, dtype=torch.float64) / b**0.5

    def grad(self, b):
        return self.h * self.x + self.noise(b)

    def common(self, j):
        return self.h * self.x + self.common_noise[j]


def test_noise_scale_recovers_the_planted_trace_and_gradient():
    q = NoisyQuadratic()
    ns = gradstats.noise_scale(lambda: q.grad(64), small=64, k=16, rounds=200)
    trace, g2 = q.sigma**2 * q.d, float((q.h * q.x) @ (q.h * q.x))
    assert ns.trace == pytest.approx(trace, rel=0.05)
    assert ns.g2 == pytest.approx(g2, rel=0.05)
    assert ns.b_simple == pytest.approx(trace / g2, rel=0.08)


def drift_rows(q, eta, u, batches, pairs, common=True, alternate=False):
    """Each batch's steps from the same weights (as study.findings.predict restores its snapshot): a
    fixed step -eta u (or, ``alternate``, +-eta u by turns: the same |dG|, bounded weights)."""
    rows, x0 = [], q.x.clone()
    for b in batches:
        q.x = x0.clone()
        sign = [1.0]

        def step(b=b, sign=sign):
            g = q.grad(b)
            q.x -= sign[0] * eta * u
            if alternate:
                sign[0] = -sign[0]
            return g

        rows.append(gradstats.along_run(b, step, q.common if common else None, warm=1,
                                        pairs=pairs))  # fmt: skip
    return rows


def test_crossover_of_a_steady_drift_is_the_analytic_one():
    """Steps of a fixed length along a fixed direction u: dG = -eta H u exactly, so SNR(B) =
    B eta^2 |H u|^2 / (2 sigma^2 d) and the crossover is 2 sigma^2 d / (eta^2 |H u|^2)."""
    q = NoisyQuadratic()
    u = torch.ones(q.d, dtype=torch.float64) / q.d**0.5
    eta = 0.1
    hu2 = float((q.h * u) @ (q.h * u))
    rows = drift_rows(q, eta, u, (256, 1024, 4096, 16384, 65536), pairs=6)
    analytic = 2 * q.sigma**2 * q.d / (eta**2 * hu2)
    trace = q.sigma**2 * q.d
    for r in rows:  # the common batches' noise cancels: |dG|^2 exact up to rounding
        assert r.dg2_mean == pytest.approx(eta**2 * hu2, rel=1e-6)
        assert r.snr_common(trace) == pytest.approx(r.batch / analytic, rel=1e-6)
    assert 256 < analytic < 65536


def test_the_snr_from_consecutive_differences_finds_the_analytic_crossover():
    """Without common batches: E|g_t - g_{t-1}|^2 = |dG|^2 + 2 tr(Sigma)/B; over many pairs the
    crossover comes out near the analytic one, and tr(Sigma) from the squared norms' line in 1/B
    near sigma^2 d."""
    q = NoisyQuadratic(seed=1)
    q.x *= 0.1  # near the optimum: the gradient's own size does not swamp the noise's
    u = torch.ones(q.d, dtype=torch.float64) / q.d**0.5
    eta = 0.1
    batches = (1024, 4096, 16384, 65536, 262144)
    rows = drift_rows(q, eta, u, batches, pairs=400, common=False, alternate=True)
    noise = gradstats.fit_noise(rows)
    assert noise.trace == pytest.approx(q.sigma**2 * q.d, rel=0.1)
    analytic = 2 * q.sigma**2 * q.d / (eta**2 * float((q.h * u) @ (q.h * u)))
    pred = gradstats.predicted_crossover(rows, noise.trace)
    assert pred["snr_passes_1"] == pytest.approx(analytic, rel=0.3)
    assert pred["crossover"] >= pred["snr_passes_1"]


def test_a_planted_oscillation_has_negative_cosines_and_no_crossover():
    """Each step flips the weights (x -> -x, Adam's edge-of-stability caricature): consecutive
    gradients point apart at every batch large enough to see it."""
    q = NoisyQuadratic()

    def flip_step(b):
        g = q.grad(b)
        q.x.neg_()
        return g

    rows = [gradstats.along_run(b, lambda b=b: flip_step(b), q.common, warm=0, pairs=5)
            for b in (1024, 16384, 262144)]  # fmt: skip
    assert rows[-1].cosine[0] < -0.9
    assert all(r.cosine[0] < 0 for r in rows)
    pred = gradstats.predicted_crossover(rows, q.sigma**2 * q.d)
    assert pred["cosine_positive_from"] == math.inf
    assert pred["crossover"] == math.inf  # the SNR is large, but the change alternates


def test_crossing_interpolates_in_log_log_and_censors():
    assert gradstats.crossing([1, 4], [0.5, 2.0]) == pytest.approx(2.0)
    assert gradstats.crossing([1, 4, 16], [0.1, 0.2, 0.5]) == math.inf
    assert gradstats.crossing([8, 32], [2.0, 8.0]) == pytest.approx(4.0)  # below the ladder


def test_bad_estimator_arguments_are_refused():
    with pytest.raises(ValueError, match="k 1 >= 2"):
        gradstats.noise_scale(lambda: torch.zeros(3), small=1, k=1, rounds=1)
    with pytest.raises(ValueError, match="pairs 0 >= 1"):
        gradstats.along_run(8, lambda: torch.zeros(3), lambda j: torch.zeros(3), warm=0, pairs=0)


def test_every_batch_of_the_sweep_runs_the_headlines_steps():
    """Each part of the definition runs proxy-100k for the headline's 966 steps at its batch."""
    n = block_params("proxy-100k")
    for b in (2048, 8192, 32768, 131072, 524288):
        assert budget_steps(n, budget_of(b), b) == 966
    parts = defs.load("crossover").parts
    batches = {name: p.values["batch_tokens"] for name, p in parts.items() if name[1:].isdigit()}
    assert list(batches.values()) == [8192, 2048, 32768, 131072, 524288]
    assert all(name == f"b{b}" for name, b in batches.items())
    for name in batches:
        (budget,) = parts[name].values["budgets"]
        assert budget == budget_of(parts[name].values["batch_tokens"])
    with pytest.raises(ValueError, match="multiple of 2048"):
        budget_of(3000)


def test_the_sweep_tunes_only_the_lr_and_checkpoints():
    d = defs.load("crossover")
    plan = defs.plan_of(d.parts["b32768"], d.parts)
    assert plan.knobs == ["lr"] and plan.budgets == [16.0]
    assert "mars-adamw:gamma=0" in plan.optimizers
    assert plan.extra == ["ckpt_every=100", "dtype=float32"]
    assert d.tables == ["crossover", "correction", "family", "readmes"]


def test_the_float32_check_reruns_the_131072_cells_choices_untuned(tmp_path, monkeypatch):
    """b131072-fp32: the 131,072-byte cell's chosen values on the evaluation seeds in float32,
    no tuning; the crossover's table keeps one row per batch (the check is not a batch)."""
    from study import parts
    from study.findings import crossover_report

    d = defs.load("crossover")
    plan = defs.plan_of(d.parts["b131072-fp32"], d.parts)
    assert plan.untuned == ["adamw", "mars-adamw", "mars-adamw:gamma=0"]
    assert str(plan.center_from).endswith("crossover/b131072/results.csv")
    assert plan.extra == ["ckpt_every=100", "dtype=float32"]
    seen = []
    monkeypatch.setattr(crossover_report, "write", lambda folder, b: seen.append(b) or folder)
    parts.write_tables(d)
    assert [(c.model, c.batch) for c in seen[0]] == [
        ("proxy-100k", b) for b in (8192, 2048, 32768, 131072, 524288)
    ] + [("proxy-423k", 8192), ("proxy-423k", 131072)]


def test_predict_probes_a_real_run_and_leaves_its_replay_unchanged(tmp_path, capsys):
    """study.findings.predict on a few steps of the proxy: a figure per phase, and the probe restores the
    run after each phase (the replay's final weights equal a plain replay's)."""
    from study.findings import predict
    from study.findings.vr_probe import build_from

    overrides = ["experiment=study", "optimizer=mars-adamw", "max_steps=4", "batch_tokens=2048"]
    out = tmp_path / "p.json"
    predict.main(["--at", "0.5", "1", "--ladder", "2048", "4096", "--warm", "1", "--pairs", "2",
                  "--common", "1", "--noise-k", "2", "--noise-rounds", "1", "--json", str(out),
                  "--figure", str(tmp_path / "p.png"), "--", *overrides])  # fmt: skip
    import json

    rec = json.loads(out.read_text())
    phases = rec["runs"][0]["phases"]
    assert [p["step"] for p in phases] == [2, 4]
    assert [r["batch"] for r in phases[0]["ladder"]] == [2048, 4096]
    assert (tmp_path / "p.png").is_file() and "predicted crossover" in capsys.readouterr().out
    plain, cfg = build_from(overrides)
    while plain.state.step < cfg.max_steps:
        plain.train_step()
    probed, _ = build_from(overrides)
    probe = predict.Probe(probed, cfg)
    while probed.state.step < cfg.max_steps:
        probed.train_step()
        if probed.state.step == 2:
            predict.probe_phase(probe, predict.parse(["--ladder", "2048", "4096", "--warm", "1",
                                "--pairs", "1", "--noise-k", "2", "--noise-rounds", "1", "--",
                                "x"])[0])  # fmt: skip
    for a, b in zip(plain.raw_model.parameters(), probed.raw_model.parameters()):
        assert torch.equal(a, b)


def _ledger(path, arms):
    """A fake batch ledger: the chosen evaluation runs of each arm, ``{arm: {seed: loss}}``."""
    import csv

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["optimizer", "model", "budget", "seed", "role",
                                          "final_val_loss", "chosen"])  # fmt: skip
        w.writeheader()
        for arm, seeds in arms.items():
            for s, loss in seeds.items():
                w.writerow({"optimizer": arm, "model": "proxy-100k", "budget": 4, "seed": s,
                            "role": "eval", "final_val_loss": loss, "chosen": 1})  # fmt: skip


def test_delta_gamma_on_a_fake_cell_is_the_paired_mean_with_holm_over_batches(tmp_path):
    from study.findings import crossover_report as cr

    base = {s: 2.0 + 0.01 * s for s in range(1, 6)}
    _ledger(tmp_path / "b8192" / "results.csv", {
        "adamw": base, "mars-adamw": {s: v + 0.10 for s, v in base.items()},
        "mars-adamw:gamma=0": {s: v + 0.05 + 0.001 * s for s, v in base.items()}})  # fmt: skip
    _ledger(tmp_path / "b32768" / "results.csv", {"adamw": base, "mars-adamw": base})
    rows = cr.effects(cr.batch_losses(tmp_path, [8192, 32768]))
    dg = [r for r in rows if r["comparison"].startswith("Delta_gamma")]
    assert len(dg) == 1 and dg[0]["cell"] == cr.Cell("proxy-100k", 8192)  # 32768 lacks gamma = 0
    assert dg[0]["mean"] == pytest.approx(0.05 - 0.003)  # 0.10 - (0.05 + 0.001 s), s = 1..5
    assert dg[0]["lo"] < dg[0]["mean"] < dg[0]["hi"] and dg[0]["holm_p"] == dg[0]["p"]
    vs = [r for r in rows if r["comparison"].startswith("MARS-AdamW - AdamW")]
    assert [r["batch"] for r in vs] == [8192, 32768]
    assert vs[0]["mean"] == pytest.approx(0.10) and vs[1]["mean"] == pytest.approx(0.0)
    assert vs[0]["holm_p"] == pytest.approx(min(1.0, 2 * vs[0]["p"]))  # two batches in the family
    report = cr.write(tmp_path, [8192, 32768, 131072])
    text = report.read_text()
    assert "| 131,072 | 0 | 0 | 0 | no |" in text and (tmp_path / "crossover.png").is_file()


def test_publish_asks_the_study_for_its_report_only_and_writes_the_table(tmp_path, monkeypatch):
    """`python -m study publish crossover`: --report-only goes before the "--" that starts
    train.py's overrides (it is a study flag), and the crossover's table is rewritten after the
    part. The old `python -m study crossover run` is refused with the command that replaced it."""
    import study.cli
    from study import parts
    from study.findings import crossover

    root = tmp_path / "checkout"
    (root / "runs" / "crossover" / "b8192" / "runs").mkdir(parents=True)
    for rel in ("results/referee/batch/results.csv", "results/crossover/predict-headline.json"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes((parts.ROOT / rel).read_bytes())
    seen = []
    monkeypatch.setattr(study.cli, "run", lambda plan, argv=None: seen.append((plan, argv)) or 0)
    pages = [parts.ROOT / "README.md", parts.ROOT / "docs" / "study.md"]
    before = [p.read_text() for p in pages]
    assert parts.main(["publish", "crossover", "--part", "b8192"], root=root) == 0
    # a study published elsewhere (here, another checkout) leaves this repository's pages alone
    assert [p.read_text() for p in pages] == before
    assert (root / "results" / "crossover" / "correction.md").is_file()
    plan, argv = seen[0]  # the Plan, and the command that builds it
    assert plan.report_only and plan.extra == ["ckpt_every=100"]
    assert argv.index("--report-only") < argv.index("--") and argv[-1] == "ckpt_every=100"
    assert (root / "results" / "crossover" / "report.md").is_file()
    assert (root / "results" / "crossover" / "crossover.png").is_file()
    with pytest.raises(SystemExit):
        crossover.parse(["run"])


def test_the_selection_table_takes_each_arms_best_lr_on_all_three_seeds(tmp_path):
    """An lr run on seeds 0 and 6 only is not chosen however low; the device column (a GPU's
    name) is where the batch ran, the CPU's name where the column is empty."""
    from study.findings import crossover_report as cr
    from study.results import write_csv

    rows = []
    for lr, base, seeds in ((0.01, 1.30, (0, 6, 7)), (0.02, 1.20, (0, 6, 7)), (0.04, 1.0, (0, 6))):
        for s in seeds:
            rows.append({"optimizer": "adamw", "role": "select", "lr": lr, "seed": s,
                         "final_val_loss": base + s / 1000, "cpu": "CPU X", "device": "GPU Y"})  # fmt: skip
    rows.append({"optimizer": "mars-adamw", "role": "select", "lr": 0.1, "seed": 0,
                 "final_val_loss": 1.5, "cpu": "CPU X", "device": ""})  # fmt: skip
    for s in (6, 7):
        rows.append({**rows[-1], "seed": s})
    (tmp_path / "b8192").mkdir()
    write_csv(rows, tmp_path / "b8192" / "results.csv")
    picked = cr.selection(tmp_path, [8192])[cr.Cell("proxy-100k", 8192)]
    assert picked["adamw"]["lr"] == 0.02 and picked["adamw"]["lrs"] == 2
    assert picked["adamw"]["mean"] == pytest.approx(1.20 + 13 / 3000)
    assert picked["adamw"]["device"] == "GPU Y, bfloat16"  # auto on a GPU: bf16 autocast
    assert picked["mars-adamw"]["device"] == "CPU X, float32"
    text = cr.markdown({}, [], [], [8192], {cr.Cell("proxy-100k", 8192): picked})
    assert "| 8,192 | adamw | 0.02 | 1.2043 | 2 | GPU Y, bfloat16 |" in text
    assert cr.ran_on({"device": "GPU Y", "command": "seed=1 dtype=float32"}) == "GPU Y, float32"
    assert cr.ran_on({"device": "GPU Y", "dtype": "float32"}) == "GPU Y, float32"
    assert cr.ran_on({"cpu": "CPU X", "command": "dtype=bfloat16"}) == "CPU X, bfloat16"
    from study.results import gpu_dtype  # the ledger's dtype column, written for GPU rows

    assert [gpu_dtype(d) for d in ("auto", "bfloat16", "float32")] == ["bfloat16", "bfloat16",
                                                                        "float32"]  # fmt: skip


def test_collapsed_evaluation_runs_are_counted_and_the_trained_pairs_described(tmp_path):
    """A ledger's collapsed evaluation runs: counted per arm in the seeds table, and each
    comparison read again on the seeds where neither run collapsed (described, not tested: the
    Holm family keeps every seed)."""
    from study.findings import crossover_report as cr
    from study.results import write_csv

    rows = []
    for arm, shift, gone in (("adamw", 0.0, {1, 2}), ("mars-adamw", 0.1, {4}),
                             ("mars-adamw:gamma=0", 0.05, {3})):  # fmt: skip
        for s in range(1, 6):
            rows.append({"optimizer": arm, "model": "proxy-100k", "budget": 64, "seed": s,
                         "role": "eval", "chosen": 1, "collapsed": int(s in gone),
                         "final_val_loss": 2.4 if s in gone else 1.2 + shift + s / 1000})  # fmt: skip
    (tmp_path / "b131072").mkdir()
    write_csv(rows, tmp_path / "b131072" / "results.csv")
    collapsed = cr.collapsed_seeds(tmp_path, [131072])
    cell = cr.Cell("proxy-100k", 131072)
    assert collapsed == {cell: {"adamw": {1, 2}, "mars-adamw": {4}, "mars-adamw:gamma=0": {3}}}
    losses = cr.batch_losses(tmp_path, [131072])
    pairs = {r["comparison"]: r for r in cr.trained_pairs(losses, collapsed)}
    dg = pairs["Delta_gamma: MARS-AdamW - (gamma = 0)"]
    assert dg["seeds"] == [1, 2, 5] and dg["left_out"] == 2
    assert dg["diffs"] == pytest.approx([0.05, 0.05, 0.05])
    assert pairs["MARS-AdamW - AdamW"]["seeds"] == [3, 5]
    text = cr.write(tmp_path, [131072]).read_text()
    assert "| 131,072 | 5 (2 collapsed) | 5 (1 collapsed) | 5 (1 collapsed) | yes |" in text
    assert "| MARS-AdamW - AdamW | 131,072 | 2 (3, 5) | +0.1000, +0.1000 | +0.1000 |" in text
    assert len(cr.effects(losses)) == 2  # the tests keep every seed


def test_a_second_proxy_is_its_own_cells_and_holm_family(tmp_path):
    """m423k-b8192: proxy-423k at 8,192 bytes, in the same table as proxy-100k's batches but in
    its own Holm family; its budget gives the same 966 steps; a check part is no cell."""
    from study.findings import crossover_report as cr

    assert cr.Cell.of("b2048") == cr.Cell("proxy-100k", 2048)
    assert cr.Cell.of("m423k-b8192") == cr.Cell("proxy-423k", 8192)
    assert (
        cr.Cell.of("b131072-fp32") is None and cr.Cell("proxy-423k", 8192).folder == "m423k-b8192"
    )
    parts = defs.load("crossover").parts
    for name in ("m423k-b8192", "m423k-b131072"):
        v = parts[name].values
        assert budget_steps(block_params("proxy-423k"), v["budgets"][0], v["batch_tokens"]) == 966
    base = {s: 2.0 + 0.01 * s for s in range(1, 6)}
    arms = {"adamw": base, "mars-adamw": {s: v + 0.1 for s, v in base.items()},
            "mars-adamw:gamma=0": {s: v + 0.05 + 0.001 * s for s, v in base.items()}}  # fmt: skip
    _ledger(tmp_path / "b8192" / "results.csv", arms)
    _ledger(tmp_path / "m423k-b8192" / "results.csv", arms)
    cells = [cr.Cell("proxy-100k", 8192), cr.Cell("proxy-423k", 8192)]
    rows = cr.effects(cr.batch_losses(tmp_path, cells))
    assert [(r["model"], r["batch"]) for r in rows if r["comparison"].startswith("MARS")] == [
        ("proxy-100k", 8192), ("proxy-423k", 8192)]  # fmt: skip
    assert all(r["holm_p"] == r["p"] for r in rows)  # one batch per proxy: nothing to adjust
    text = cr.write(tmp_path, cells).read_text()
    assert "| 8,192 (proxy-423k) | 5 | 5 | 5 | yes |" in text


def test_a_float32_check_is_listed_beside_the_cell_s_own_runs_and_tests_nothing(tmp_path):
    """b131072-fp32's finished evaluation runs, each beside the cell's run of the same arm and
    seed (its loss, whether it collapsed, where it ran): AdamW's seed 1 collapsed in the cell's
    bf16 run and trains in float32; the check adds no test and no cell."""
    from study.findings import crossover_report as cr
    from study.results import write_csv

    def rows(losses, gone, **where):  # noqa: ANN001, ANN003, ANN202
        return [{"optimizer": arm, "model": "proxy-100k", "budget": 64, "seed": s, "role": "eval",
                 "chosen": 1, "collapsed": int((arm, s) in gone), "final_val_loss": v, **where}
                for (arm, s), v in losses.items()]  # fmt: skip

    cell = {(a, s): 1.2 + i / 10 + s / 1000 for i, a in enumerate(cr.ARMS) for s in range(1, 6)}
    cell[("adamw", 1)] = 2.45
    (tmp_path / "b131072").mkdir()
    write_csv(rows(cell, {("adamw", 1)}, device="NVIDIA H100 80GB HBM3"),
              tmp_path / "b131072" / "results.csv")  # fmt: skip
    (tmp_path / "b131072-fp32").mkdir()
    check = {("mars-adamw", 1): 1.3012, ("adamw", 2): 1.2021, ("adamw", 1): 1.2011}
    write_csv(rows(check, set(), cpu="AMD EPYC", command="train.py dtype=float32"),
              tmp_path / "b131072-fp32" / "results.csv")  # fmt: skip
    got = cr.fp32_checks(tmp_path, [131072])
    assert [(r["arm"], r["seed"]) for r in got] == [("adamw", 1), ("adamw", 2), ("mars-adamw", 1)]
    first = got[0]
    assert first["cell_collapsed"] and not first["collapsed"]
    assert (first["cell_loss"], first["loss"]) == (2.45, 1.2011)
    assert (
        first["cell_ran_on"] == "NVIDIA H100 80GB HBM3, bfloat16"
        and first["ran_on"] == "AMD EPYC, float32"
    )
    text = cr.write(tmp_path, [131072]).read_text()
    assert (
        "| 131,072 | adamw | 1 | 2.4500 (collapsed) | NVIDIA H100 80GB HBM3, bfloat16 | 1.2011 | AMD EPYC, float32 |"
        in text
    )
    assert len(cr.effects(cr.batch_losses(tmp_path, [131072]))) == 2  # the cell's two, no more


def test_the_traces_standard_error_covers_the_planted_covariance():
    """Planted gradients G + noise of covariance Sigma / b (diagonal, tr known): over 40
    independent estimates, the 90% interval (1.645 jackknife standard errors) covers the true
    trace and |G|^2 about 90% of the time, and the errors shrink with more rounds."""
    gen = torch.Generator().manual_seed(3)
    d, small = 50, 32
    scales = torch.linspace(0.5, 2.0, d, dtype=torch.float64)
    grad = 0.3 * torch.ones(d, dtype=torch.float64)
    true_trace, true_g2 = float((scales**2).sum()), float(grad @ grad)

    def sample():
        return grad + scales * torch.randn(d, generator=gen, dtype=torch.float64) / small**0.5

    hits_t = hits_g = 0
    for _ in range(40):
        ns = gradstats.noise_scale(sample, small=small, k=4, rounds=12)
        hits_t += abs(ns.trace - true_trace) <= 1.645 * ns.trace_se
        hits_g += abs(ns.g2 - true_g2) <= 1.645 * ns.g2_se
        assert ns.b_simple_se > 0
    assert 28 <= hits_t <= 40 and 28 <= hits_g <= 40
    few = gradstats.noise_scale(sample, small=small, k=4, rounds=4)
    many = gradstats.noise_scale(sample, small=small, k=4, rounds=64)
    assert many.trace_se < few.trace_se
    one = gradstats.noise_scale(sample, small=small, k=4, rounds=1)
    assert math.isnan(one.trace_se)
