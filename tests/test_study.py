"""The study's statistics and grid with known answers (docs/study.md): a planted speedup is
recovered inside its interval, pairing narrows the interval on correlated seeds, speedups beyond
the measured budgets are censored, and a grid whose optimum lies outside the first grid grows
until the best is bracketed (or says it hit the cap)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from analysis.speedup import data_equivalent_speedup, data_needed, isotonic_decreasing
from analysis.stats import bootstrap_pairs, paired_interval, t_quantile, unpaired_interval
from study.plan import Plan, budget_steps

SEEDS = [1, 2, 3, 4, 5]


def law(tokens: float) -> float:
    """A loss-vs-data law with the shape of real ones: 2 + 3 (D / 1M)^-0.3."""
    return 2.0 + 3.0 * (tokens / 1e6) ** -0.3


def synthetic(planted: float, noise: float = 0.005, seed: int = 0) -> tuple[dict, dict]:
    """AdamW at 1M, 2M, 4M tokens and another optimizer at 1M that reaches AdamW's loss at
    ``planted`` x 1M; a seed shifts every run of that seed alike (shared weights and data)."""
    rng = np.random.default_rng(seed)
    shift = {s: rng.normal(0, 0.03) for s in SEEDS}
    adamw = {d: {s: law(d) + shift[s] + rng.normal(0, noise) for s in SEEDS}
             for d in (1e6, 2e6, 4e6)}  # fmt: skip
    other = {s: law(planted * 1e6) + shift[s] + rng.normal(0, noise) for s in SEEDS}
    return adamw, other


def test_t_quantiles_match_tables() -> None:
    assert t_quantile(0.95, 4) == pytest.approx(2.1318, abs=1e-4)
    assert t_quantile(0.975, 10) == pytest.approx(2.2281, abs=1e-4)
    assert t_quantile(0.05, 4) == pytest.approx(-2.1318, abs=1e-4)


def test_planted_speedup_is_recovered_inside_its_interval() -> None:
    """Over 100 synthetic studies the 90% interval holds the planted 1.25x about 90% of the
    time, and the estimate is not biased by the interpolation between AdamW's budgets."""
    results = [data_equivalent_speedup(*synthetic(1.25, seed=k), 1e6) for k in range(100)]
    assert all(not r.point.censored for r in results)
    covered = np.mean([r.lo.value <= 1.25 <= r.hi.value for r in results])
    assert covered >= 0.8
    assert np.median([r.point.value for r in results]) == pytest.approx(1.25, rel=0.01)
    # the bootstrap option: around its estimate; with 5 pairs a percentile bootstrap covers less
    # than its level (why the t-interval is the default)
    boots = [
        data_equivalent_speedup(*synthetic(1.25, seed=k), 1e6, bootstrap=True, resamples=200)
        for k in range(20)
    ]
    assert all(b.lo.value <= b.point.value <= b.hi.value for b in boots)
    assert np.mean([b.lo.value <= 1.25 <= b.hi.value for b in boots]) >= 0.5


def test_paired_interval_is_narrower_on_correlated_seeds() -> None:
    adamw, other = synthetic(1.25)
    paired = paired_interval(adamw[1e6], other)
    unpaired = unpaired_interval(list(adamw[1e6].values()), list(other.values()))
    assert paired.mean == pytest.approx(unpaired.mean)
    assert paired.hi - paired.lo < 0.5 * (unpaired.hi - unpaired.lo)
    assert paired.significant and paired.hi < 0  # lower loss, and the seeds can tell
    boot = bootstrap_pairs([other[s] - adamw[1e6][s] for s in SEEDS])
    assert boot.lo <= paired.mean <= boot.hi


def test_speedups_beyond_the_measured_budgets_are_censored() -> None:
    adamw, _ = synthetic(1.0)
    far_better = {s: law(10e6) for s in SEEDS}  # AdamW would need 10x: more than its 4x
    sp = data_equivalent_speedup(adamw, far_better, 1e6)
    assert str(sp.point) == ">4.00x" and sp.point.censored
    worse = {s: law(0.5e6) for s in SEEDS}  # below AdamW's smallest budget
    assert str(data_equivalent_speedup(adamw, worse, 1e6).point) == "<1.00x"
    assert data_needed(law(2e6), [1e6, 2e6, 4e6], [law(d) for d in (1e6, 2e6, 4e6)]) == (
        pytest.approx(2e6),
        "",
    )


def test_adamws_curve_is_made_monotone() -> None:
    assert isotonic_decreasing([3.0, 2.5, 2.6, 2.0]).tolist() == pytest.approx(
        [3.0, 2.55, 2.55, 2.0]
    )


def run_line(optimum: float, center: float, cap: int = 9):  # noqa: ANN201
    """One lr line on one seed, to the end: a bowl in log lr, diverging far above the optimum."""
    from study.tuner import search_line

    results: dict = {}
    for _ in range(20):
        line = search_line("lr", {"lr": center}, [0], lambda p, s: results.get(p["lr"]), cap=cap)
        if not line.pending:
            return line, results
        for p, _s in line.pending:
            lr = p["lr"]
            results[lr] = math.inf if lr > 64 * optimum else math.log2(lr / optimum) ** 2
    raise AssertionError("the line never settled")


def test_grid_outside_the_first_grid_is_extended_until_bracketed() -> None:
    line, results = run_line(optimum=0.1, center=0.008)
    assert line.flag == "bracketed"
    assert line.best == pytest.approx(0.128)  # the lattice value nearest 0.1 in log
    values = sorted(results)
    i = values.index(line.best)
    assert i >= 2 and len(values) - 1 - i >= 2
    assert len(results) > 5  # the first grid (5 values) was not enough


def test_grid_cap_is_flagged() -> None:
    line, results = run_line(optimum=10.0, center=0.001, cap=6)
    assert line.flag == "capped" and len(results) == 6


def test_budget_and_seeds() -> None:
    assert budget_steps(100_000, 1.0, 4096) == math.ceil(2_000_000 / 4096)
    with pytest.raises(ValueError, match="both selection and evaluation seeds"):
        Plan(out=None, optimizers=["adamw"], models=["proxy-100k"], budgets=[1.0],
             select_seeds=[0, 1], eval_seeds=[1, 2, 3])  # fmt: skip


def test_min_lr_ratio_ends_each_group_at_its_own_fraction() -> None:
    from optim.schedules import ScheduleConfig, lr_at

    cfg = ScheduleConfig(name="cosine", warmup_steps=10, min_lr_ratio=0.1)
    for peak in (1e-3, 2e-2):
        assert lr_at(5, peak, cfg, 100) == pytest.approx(peak / 2)
        assert lr_at(100, peak, cfg, 100) == pytest.approx(0.1 * peak)
        assert lr_at(55, peak, cfg, 100) == pytest.approx(0.55 * peak)  # halfway down the cosine
    with pytest.raises(ValueError, match="keep one"):
        ScheduleConfig(min_lr=1e-4, min_lr_ratio=0.1)


def _row(opt: str, budget: float, seed: int, loss: float, role: str = "eval", **more) -> dict:
    return {"optimizer": opt, "model": "proxy-100k", "non_embedding_params": 98848.0,
            "budget": budget, "tokens": budget * 1e6, "lr": 0.004, "seed": float(seed),
            "role": role, "final_val_loss": loss, "chosen": 1.0, "grid": "lr:bracketed",
            "max_steps": 100.0, "batch_tokens": 2048.0, "warmup_steps": 10.0, **more}  # fmt: skip


def test_report_tables_from_results_rows() -> None:
    """The report reads rows as results.csv holds them: a planted 1.25x shows as a significant
    lower loss with its speedup; a capped grid is flagged."""
    from study.report import comparison_table
    from study.tables import knob_table

    adamw, other = synthetic(1.25)
    rows = [_row("adamw", d / 1e6, s, v) for d, seeds in adamw.items() for s, v in seeds.items()]
    rows += [_row("muon", 1.0, s, v) for s, v in other.items()]
    rows += [_row("muon", 1.0, 0, 3.0, role="select", grid="lr:capped")]
    table = "\n".join(comparison_table(rows, [1.0], bootstrap=False))
    muon = next(line for line in table.splitlines() if "| muon |" in line)
    assert "yes: lower" in muon
    value = float(muon.rsplit("|", 2)[1].split("x")[0])
    assert value == pytest.approx(1.25, abs=0.05)
    assert "0.004 (capped)" in "\n".join(knob_table(rows))
    one = [r for r in rows if r["optimizer"] != "adamw" or r["budget"] == 1.0]
    table = "\n".join(comparison_table(one, [1.0], bootstrap=False))
    assert "n/a (AdamW at one budget)" in table and ">1.00x" not in table


def test_report_says_when_a_gap_does_not_survive_holm() -> None:
    """Three optimizers, each pair's paired p 0.067 (the 90% interval excludes 0): Holm over the
    three pairs gives 0.20, so the table says 'not after correction', never 'yes'."""
    from study.report import comparison_table
    from study.tables import pairs_holm

    x = {1: 1.10, 2: 1.02, 3: 1.08, 4: 0.99, 5: 1.06}
    rows = [_row("adamw", 1.0, s, 1.0) for s in x]
    rows += [_row("mars-adamw", 1.0, s, v) for s, v in x.items()]
    rows += [_row("muon", 1.0, s, 1.0 + 2 * (v - 1.0)) for s, v in x.items()]
    _, pairs = pairs_holm(rows, [1.0])
    holm_p = {(p["model"], p["budget"], p["a"], p["b"]): p["p_holm"] for p in pairs}
    table = "\n".join(comparison_table(rows, [1.0], bootstrap=False, holm_p=holm_p))
    for opt in ("mars-adamw", "muon"):
        line = next(row for row in table.splitlines() if f"| {opt} |" in row)
        assert "not after correction (higher before it; Holm p 0.2)" in line and "yes" not in line


def test_grid_fills_the_holes_an_interruption_left() -> None:
    from study.tuner import search_line

    # the first grid was 0.001..0.016; only its ends finished before an interruption
    done = {0.001: 2.7, 0.016: 2.8}
    line = search_line("lr", {"lr": 0.004}, [0], lambda p, s: done.get(p["lr"]))
    assert sorted(p["lr"] for p, _ in line.pending) == [0.002, 0.004, 0.008]


def test_the_first_round_runs_its_window_before_extending_past_one_finished_value() -> None:
    """Centred at 0.008, only 0.002 (the window's low end) has finished: the window's other four
    values come first, then the extension the lone value asks for; a bracketed line asks for
    nothing more (a finished line replays as before)."""
    from study.tuner import search_line

    line = search_line("lr", {"lr": 0.008}, [0], lambda p, s: {0.002: 1.66}.get(p["lr"]))
    assert [p["lr"] for p, _ in line.pending][:4] == [0.004, 0.008, 0.016, 0.032]
    assert {p["lr"] for p, _ in line.pending[4:]} == {0.001, 0.0005}
    done = {0.001: 1.9, 0.002: 1.7, 0.004: 1.6, 0.008: 1.8, 0.016: 1.9}  # 0.032 never ran
    line = search_line("lr", {"lr": 0.008}, [0], lambda p, s: done.get(p["lr"]))
    assert line.pending == [] and line.best == 0.004 and line.flag == "bracketed"


def test_a_line_waiting_on_its_next_value_names_its_likely_finalists_on_the_other_seeds() -> None:
    """Stage 1 wants 0.128 (the best, 0.032, has one worse value past it); ``ahead`` is the
    present three best on seeds 6 and 7, the best first, less what has run; with one seed,
    nothing is ahead; a finished line has nothing ahead either."""
    from study.tuner import search_line

    first = {0.004: 1.62, 0.008: 1.48, 0.016: 1.36, 0.032: 1.31, 0.064: 1.43}
    done = {(0.032, 6): 1.30}

    def loss_of(p, s):  # noqa: ANN001, ANN202
        return first.get(p["lr"]) if s == 0 else done.get((p["lr"], s))

    line = search_line("lr", {"lr": 0.016}, [0, 6, 7], loss_of)
    assert [(p["lr"], s) for p, s in line.pending] == [(0.128, 0)]
    assert [(p["lr"], s) for p, s in line.ahead] == [
        (0.032, 7), (0.016, 6), (0.016, 7), (0.064, 6), (0.064, 7)
    ]  # fmt: skip
    assert not search_line("lr", {"lr": 0.016}, [0], lambda p, s: first.get(p["lr"])).ahead
    first[0.128] = 1.6
    line = search_line("lr", {"lr": 0.016}, [0, 6, 7], loss_of)
    assert not line.ahead and (0.016, 6) in [(p["lr"], s) for p, s in line.pending]


def test_a_waiting_line_names_the_value_it_leans_to_and_one_tuned_key_makes_it_the_choice() -> None:
    """The 32,768-byte gamma = 0 line as it stood: 0.064's seed 7 still running, the leader by
    the mean over the seeds each finalist has finished is 0.032 (1.3144, not 0.064's 1.4963 on
    two seeds); in stage 1 it is the best on the first seed; ``Tuned.likely`` is the whole
    point with one tuned key and None with two (a later key may still move); a finished line
    leans to nothing."""
    from study.tuner import search_line, tune

    first = {0.004: 1.6234, 0.008: 1.4806, 0.016: 1.3648, 0.032: 1.3150, 0.064: 1.4321,
             0.128: 2.1716}  # fmt: skip
    done = {(0.016, 6): 1.3594, (0.016, 7): 1.3689, (0.032, 6): 1.3053, (0.032, 7): 1.3229,
            (0.064, 6): 1.5605}  # fmt: skip

    def loss_of(p, s):  # noqa: ANN001, ANN202
        return first.get(p["lr"]) if s == 0 else done.get((p["lr"], s))

    line = search_line("lr", {"lr": 0.016}, [0, 6, 7], loss_of)
    assert [(p["lr"], s) for p, s in line.pending] == [(0.064, 7)]
    assert line.likely == 0.032
    tuned = tune(["lr"], {"lr": 0.016, "wd": 0.1}, [0, 6, 7], loss_of)
    assert tuned.pending and tuned.likely == {"lr": 0.032, "wd": 0.1}
    del first[0.128]
    assert search_line("lr", {"lr": 0.016}, [0, 6, 7], loss_of).likely == 0.032  # stage 1
    assert tune(["lr", "wd"], {"lr": 0.016, "wd": 0.1}, [0, 6, 7], loss_of).likely is None
    first[0.128], done[(0.064, 7)] = 2.1716, 1.5
    line = search_line("lr", {"lr": 0.016}, [0, 6, 7], loss_of)
    assert not line.pending and line.best == 0.032 and line.likely is None


def test_every_optimizer_states_its_routing_and_the_lr_it_is_tuned_with() -> None:
    """The report's equal-treatment table, read off the optimizers as built with aux_lr set:
    the block matrices at lr, every other parameter at aux_lr, whatever its update."""
    from study.plan import Cell
    from study.routing import routing

    plan = Plan(out=Path("/nonexistent"), optimizers=[], models=["proxy-100k"], budgets=[1.0])
    cases = {
        "normuon": {"block matrices": ("NorMuon", "lr"),
                    "token embedding = head (tied)": ("AdamW", "aux_lr")},
        "soap": {"block matrices": ("SOAP", "lr"), "norm gains (1-D)": ("SOAP's Adam", "aux_lr")},
        "mars-soap": {"block matrices": ("MARS-SOAP", "lr"),
                      "norm gains (1-D)": ("AdamW fallback", "aux_lr")},
        "mars-ademamix": {"token embedding = head (tied)": ("MARS-AdEMAMix", "aux_lr")},
        "adamw-schedulefree": {"block matrices": ("Schedule-Free AdamW", "lr")},
        "mars-adamw": {"token embedding = head (tied)": ("MARS-AdamW", "aux_lr")},
        "moonlight": {"norm gains (1-D)": ("AdamW", "aux_lr")},
    }  # fmt: skip
    for opt, want in cases.items():
        rows = routing(opt, "proxy-100k", {"aux_lr": 1.0})
        tuned = set(plan.keys(Cell(opt, "proxy-100k", 1.0)))
        for params, _update, lr in rows:
            assert lr in tuned and (lr == "lr") == (params == "block matrices"), (opt, rows)
        for kind, (update, lr) in want.items():
            hit = [r for r in rows if kind in r[0].split(", ")]
            assert hit and hit[0][1].startswith(update) and hit[0][2] == lr, (opt, kind, rows)


def test_center_option_is_checked() -> None:
    from study.cli import main

    with pytest.raises(SystemExit, match="not a knob"):
        main(["--out", "/nonexistent/x", "--optimizers", "adamw", "--center",
              "adamw:optimizer.lr_1d=0.1", "--dry-run"])  # fmt: skip
    with pytest.raises(SystemExit, match="OPT:KEY=VALUE"):
        main(["--out", "/nonexistent/x", "--optimizers", "adamw", "--center", "adamw:lr",
              "--dry-run"])  # fmt: skip


def test_merged_rows_join_only_the_cells_a_study_lacks(tmp_path: Path) -> None:
    from study.report import merged_rows
    from study.results import write_csv

    def row(opt: str, budget: float, seed: int, loss: float) -> dict:
        return {"optimizer": opt, "model": "proxy-100k", "budget": budget, "seed": seed,
                "role": "eval", "final_val_loss": loss, "run_dir": f"runs/{opt}/{seed}"}  # fmt: skip

    own = [row("adamw", 0.25, 1, 2.5), row("soap", 0.25, 1, 2.4)]
    other = tmp_path / "earlier" / "results.csv"
    other.parent.mkdir()
    write_csv([row("adamw", 0.25, 1, 2.5), row("muon", 0.25, 1, 2.2), row("muon", 1.0, 1, 1.9)],
              other)  # fmt: skip
    extra = merged_rows(own, [other])
    assert [(r["optimizer"], r["budget"]) for r in extra] == [("muon", 0.25), ("muon", 1.0)]
    assert extra[0]["run_dir"] == "earlier:runs/muon/1"
    assert merged_rows(own, [other], ["adamw"]) == []  # adamw 0.25x is own; muon filtered out
    with pytest.raises(SystemExit, match="no such file"):
        from study.cli import main

        main(["--out", str(tmp_path / "s"), "--report-only", "--merge", str(tmp_path / "nope.csv")])


def test_routing_table_covers_every_optimizer_with_fixed_values() -> None:
    """FIXED holds optimizer options (muon's routing) and others (Schedule-Free's schedule)."""
    from study.plan import FIXED
    from study.report import routing_table

    rows = [{"optimizer": opt, "model": "proxy-100k"} for opt in FIXED]
    lines = routing_table(rows)
    assert any("| adamw-schedulefree | block matrices | Schedule-Free AdamW" in x for x in lines)
    assert any(x.startswith("| muon | block matrices | Muon") for x in lines)


def test_an_ablation_variant_runs_untuned_at_given_values(tmp_path: Path) -> None:
    """``mars-soap:gamma=0 --untuned`` evaluates the registered mars-soap with gamma 0 at the
    given lrs on the evaluation seeds, no selection runs; its routing says gamma 0."""
    from study.plan import Cell, dir_name, split_variant
    from study.report import routing_table
    from study.state import Study

    assert split_variant("mars-soap:gamma=0,clip=none") == (
        "mars-soap", ["optimizer.gamma=0", "optimizer.clip=none"])  # fmt: skip
    assert split_variant("adamw") == ("adamw", [])
    assert dir_name("mars-soap:gamma=0") == "mars-soap@gamma-0"
    for bad in ("mars-soap:", "mars-soap:gamma", "mars-soap:=1"):
        with pytest.raises(ValueError, match="NAME:KEY=VALUE"):
            split_variant(bad)
    opt = "mars-soap:gamma=0"
    values = {"lr": 0.064, "aux_lr": 0.016}
    plan = Plan(out=tmp_path, optimizers=[opt], models=["proxy-100k"], budgets=[0.25],
                baseline_budgets=[], untuned=[opt], centers={opt: values})  # fmt: skip
    state = Study(plan).update(Cell(opt, "proxy-100k", 0.25))
    assert state.chosen == values and set(state.flags.values()) == {"fixed"}
    assert len(state.pending) == 5 and all("/eval/" in str(r.out_dir) for r in state.pending)
    assert "mars-soap@gamma-0" in str(state.pending[0].out_dir)
    fixed = state.pending[0].overrides
    assert "optimizer=mars-soap" in fixed and "optimizer.gamma=0" in fixed
    assert "optimizer.lr=0.064" in fixed and "optimizer.aux_lr=0.016" in fixed
    with pytest.raises(ValueError, match="give its values with --center"):
        Plan(out=tmp_path, optimizers=[opt], models=["proxy-100k"], budgets=[0.25], untuned=[opt])
    lines = routing_table([{"optimizer": opt, "model": "proxy-100k"}])
    assert any("MARS-SOAP (gamma 0)" in x for x in lines)


def test_a_censored_interval_holds_its_point() -> None:
    """NorMuon at 0.25x (results/superseded/0.25x): two seeds beyond AdamW's 4x budget enter the
    t-interval at their bound; the lower end, read from them, had come out above the point
    read at the mean loss (3.71x [3.75x, >3.99x]). The interval now holds its point."""
    tokens = (495616.0, 989184.0, 1978368.0)
    per_seed = {1: (2.5382, 2.4390, 1.6136), 2: (2.6113, 2.4613, 1.8442),
                3: (2.5481, 2.3456, 1.8977), 4: (2.8604, 2.2210, 2.0125),
                5: (2.5834, 2.3240, 1.9398)}  # fmt: skip
    adamw = {t: {s: v[i] for s, v in per_seed.items()} for i, t in enumerate(tokens)}
    other = {1: 1.9335, 2: 1.9316, 3: 1.9479, 4: 1.9787, 5: 1.9575}
    r = data_equivalent_speedup(adamw, other, tokens[0])
    assert not r.point.censored and r.hi.censored
    assert r.lo.value <= r.point.value < r.hi.value


def test_a_bad_optimizer_or_variant_option_is_refused_before_any_run(tmp_path: Path) -> None:
    for name, msg in (("mars-sop", "unknown optimizer 'mars-sop'; valid optimizers: "),
                      ("mars-soap:gama=0", "mars-soap has no option gama; its options: ")):  # fmt: skip
        with pytest.raises(ValueError, match=msg):
            Plan(out=tmp_path, optimizers=[name], models=["proxy-100k"], budgets=[0.25])
    assert not list(tmp_path.iterdir())


def test_a_variant_can_tune_a_key_of_its_own(tmp_path: Path) -> None:
    """``adamw:aux_lr=tuned`` tunes aux_lr even in a study whose knobs are the lr alone (the
    equal-lr control of the earlier studies); a key that is not a knob (``adamw:eps=tuned``)
    is tuned after the knobs on a x2 lattice from its --center."""
    from study.plan import Cell, dir_name, split_variant, variant_tuned
    from study.state import Study

    opt = "adamw:aux_lr=tuned"
    assert split_variant(opt) == ("adamw", []) and variant_tuned(opt) == ["aux_lr"]
    assert split_variant("adamw:aux_lr=tuned,eps=1e-10") == ("adamw", ["optimizer.eps=1e-10"])
    assert split_variant("mars-adamw:betas=[0.9,0.95],batch_tokens=8192") == (
        "mars-adamw", ["optimizer.betas=[0.9,0.95]", "batch_tokens=8192"])  # fmt: skip
    assert dir_name(opt) == "adamw@aux_lr-tuned"
    plan = Plan(out=tmp_path, optimizers=["adamw", opt, "adamw:eps=tuned"], knobs=["lr"],
                models=["proxy-100k"], budgets=[0.25], baseline_budgets=[],
                centers={opt: {"optimizer.lr": 0.016}, "adamw:eps=tuned": {"eps": 1e-8}})  # fmt: skip
    cell = Cell(opt, "proxy-100k", 0.25)
    assert plan.keys(cell) == ["lr", "aux_lr"]
    assert plan.keys(Cell("adamw", "proxy-100k", 0.25)) == ["lr"]
    assert plan.keys(Cell("adamw:eps=tuned", "proxy-100k", 0.25)) == ["lr", "eps"]
    assert plan.center(cell, "aux_lr") == 0.016
    state = Study(plan).update(cell)
    first = state.pending[0]
    assert "adamw@aux_lr-tuned/select" in str(first.out_dir)
    assert "optimizer=adamw" in first.overrides and "optimizer.aux_lr=0.016" in first.overrides
    assert not any("tuned" in f for f in first.overrides)
    with pytest.raises(ValueError, match="adamw has no option aux_l;"):
        Plan(out=tmp_path, optimizers=["adamw:aux_l=tuned"], models=["proxy-100k"],
             budgets=[0.25])  # fmt: skip


def test_a_variants_batch_sets_its_steps(tmp_path: Path) -> None:
    from study.plan import Cell
    from study.state import Study

    opt = "mars-adamw:batch_tokens=8192,mode=exact"
    plan = Plan(out=tmp_path, optimizers=[opt], models=["proxy-100k"], budgets=[1.0],
                baseline_budgets=[], untuned=[opt], centers={opt: {"lr": 0.004}})  # fmt: skip
    study = Study(plan)
    run = study.update(Cell(opt, "proxy-100k", 1.0)).pending[0]
    assert run.max_steps == budget_steps(98848, 1.0, 8192)
    assert "batch_tokens=8192" in run.overrides and "optimizer.mode=exact" in run.overrides
