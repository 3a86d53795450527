"""The study's protocol with known answers (docs/study.md, "The protocol"): selection by the mean
over several seeds avoids a planted winner's curse; repeated coordinate descent reaches a planted
joint optimum that one pass misses; the same knobs for every optimizer; the collapse flag; Holm's
correction; the dirty-tree refusal; the tuning table; curves written and read back; the whole
cell (tuning, evaluation, the swap) replayed from run directories."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml

from study.knobs import KNOBS, overrides
from study.tuner import tune


def _lattice_loss(fn):  # noqa: ANN001, ANN202
    """A ``loss_of`` over a dict of finished runs, and the function that finishes them."""
    runs: dict = {}

    def key(p: dict, s: int) -> tuple:
        return tuple(sorted((k, round(v, 10)) for k, v in p.items())) + (s,)

    def loss_of(p: dict, s: int) -> float | None:
        return runs.get(key(p, s))

    def finish(pending: list) -> None:
        for p, s in pending:
            runs[key(p, s)] = fn(p, s)

    return loss_of, finish, runs


def _run_to_end(keys, start, seeds, fn, **kw):  # noqa: ANN001, ANN202
    loss_of, finish, runs = _lattice_loss(fn)
    for _ in range(200):
        t = tune(keys, start, seeds, loss_of, **kw)
        if t.done:
            return t, runs
        finish(t.pending)
    raise AssertionError("the tuner did not finish")


def test_selection_by_the_mean_avoids_a_planted_winners_curse() -> None:
    """lr 0.004 is best in truth; lr 0.008 is 0.05 worse but its seed-0 run was lucky by 0.12.
    One selection seed picks the lucky value; the mean over three seeds picks the true best."""
    kn = KNOBS["lr"]
    truth = {kn.index(v): 2.0 + 0.3 * (math.log2(v / 0.004)) ** 2 for v in
             [kn.value(k) for k in range(-4, 10)]}  # fmt: skip
    truth[kn.index(0.008)] = 2.05

    def fn(p: dict, s: int) -> float:
        k = kn.index(p["lr"])
        luck = -0.12 if (k == kn.index(0.008) and s == 0) else 0.0
        return truth[k] + luck + 0.001 * s

    one, _ = _run_to_end(["lr"], {"lr": 0.004}, [0], fn)
    three, runs = _run_to_end(["lr"], {"lr": 0.004}, [0, 6, 7], fn)
    assert one.chosen["lr"] == 0.008
    assert three.chosen["lr"] == 0.004 and three.flags["lr"] == "bracketed"
    line = three.lines[-1]
    assert set(line.means) >= {0.002, 0.004, 0.008}  # the choice is bracketed by worse means
    assert line.means[0.002] > line.means[0.004] < line.means[0.008]


def test_repeated_coordinate_descent_reaches_a_joint_optimum_one_pass_misses() -> None:
    """In lattice units (x for lr, y for aux_lr) the loss is (x - 0.3 y - 1)^2 + (y - 4)^2:
    from (0, 0) one pass stops at (1, 4); passes until none moves reach (2, 4)."""
    kl, ka = KNOBS["lr"], KNOBS["aux_lr"]
    o = kl.index(1e-3)

    def fn(p: dict, s: int) -> float:
        x, y = kl.index(p["lr"]) - o, ka.index(p["aux_lr"]) - o
        return (x - 0.3 * y - 1) ** 2 + (y - 4) ** 2 + 0.0001 * s

    start = {"lr": 1e-3, "aux_lr": 1e-3}
    one, _ = _run_to_end(["lr", "aux_lr"], start, [0, 6, 7], fn, max_passes=1)
    assert (one.chosen["lr"], one.chosen["aux_lr"]) == (2e-3, 16e-3) and not one.converged
    full, _ = _run_to_end(["lr", "aux_lr"], start, [0, 6, 7], fn)
    assert (full.chosen["lr"], full.chosen["aux_lr"]) == (4e-3, 16e-3)
    assert full.converged and full.passes == 3  # the third pass moved nothing


def test_a_best_beyond_the_lattice_bound_is_flagged_edge_and_the_cap_capped() -> None:
    kn = KNOBS["warmup"]

    def fn(p: dict, s: int) -> float:
        return -p["warmup"]  # the longer the better: runs into the bound 0.5

    t, _ = _run_to_end(["warmup"], {"warmup": 0.1}, [0, 6], fn)
    assert t.chosen["warmup"] == kn.value(kn.index(0.4)) and t.flags["warmup"] == "edge"

    def falling(p: dict, s: int) -> float:
        return -math.log(p["lr"])

    t, _ = _run_to_end(["lr"], {"lr": 1e-3}, [0], falling, cap=5)
    assert t.flags["lr"] == "capped"


def test_every_optimizer_gets_the_same_knobs_with_the_same_meaning() -> None:
    """aux_lr, wd and beta2 reach every optimizer of the headline comparison; beta2 sets the
    second-moment beta where there is one, the Muon family's momentum where there is none."""
    from optim import get_spec

    assert overrides("adamw", "beta2", 0.99, 100) == ["optimizer.betas=[0.9,0.99]"]
    assert overrides("mars-adamw", "beta2", 0.99, 100) == ["optimizer.betas=[0.95,0.99]"]
    assert overrides("moonlight", "beta2", 0.9776, 100) == ["optimizer.momentum=0.9776"]
    assert overrides("adamw", "warmup", 0.1, 966) == ["schedule.warmup_steps=97"]
    for opt in ("adamw", "mars-adamw", "muon", "mars-m", "moonlight"):
        fields = set(get_spec(opt).config_cls.__dataclass_fields__)
        assert {"lr", "aux_lr", "weight_decay"} <= fields, opt
        assert fields & {"betas", "momentum"}, opt


def test_collapse_flag() -> None:
    from study.curves import collapse_reason, rise

    flat = [{"kind": "train", "loss": x} for x in (3.0, 2.5, 2.2, 2.1, 2.0, 2.0)]
    spike = [{"kind": "train", "loss": x} for x in (3.0, 2.2, 2.0, 2.0, 2.9, 3.1, 3.0)]
    assert rise([3.0, 2.0, 2.0, 2.0]) == pytest.approx(1.0)
    assert collapse_reason(1.8, 2.356, flat) == ""
    assert collapse_reason(2.40, 2.356, flat) == "floor"
    assert collapse_reason(math.inf, 2.356, flat) == "diverged"
    assert collapse_reason(2.0, 2.356, spike) == "rise"
    assert collapse_reason(2.40, None, flat) == ""


def test_holm_on_planted_p_values() -> None:
    from analysis.stats import holm, paired_p_value

    # m = 4: sorted 0.01, 0.02, 0.03, 0.5 -> 0.04, 0.06, 0.06 (monotone), 0.5
    assert holm([0.03, 0.01, 0.5, 0.02]) == pytest.approx([0.06, 0.04, 0.5, 0.06])
    assert holm([]) == []
    base = {s: 2.0 for s in range(1, 6)}
    assert paired_p_value(base, {s: 2.0 + 0.1 + 0.01 * s for s in base}) < 0.001
    assert paired_p_value(base, {s: 2.0 + (-1) ** s * 0.1 for s in base}) > 0.5


def test_a_dirty_tree_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    import study.cli as cli

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "a.py").write_text("x = 1\n")
    git = ["git", "-C", str(tmp_path), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "add", "a.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "a"], check=True)
    assert cli.dirty_files(tmp_path) == []
    (tmp_path / "a.py").write_text("x = 2\n")
    (tmp_path / "new.py").write_text("untracked files do not count\n")
    assert cli.dirty_files(tmp_path) == ["a.py"]
    monkeypatch.setattr(cli, "dirty_files", lambda: ["optim/core.py"])
    out = tmp_path / "study"
    with pytest.raises(SystemExit, match="uncommitted changes to tracked files .optim/core.py"):
        cli.main(["--out", str(out), "--optimizers", "adamw", "--budgets", "0.25"])
    assert not out.exists()


def test_provenance_tells_an_untracked_log_from_changed_code(tmp_path: Path) -> None:
    """A run beside an untracked log is marked +untracked(log), not +dirty: its tracked code is the
    commit's. A tracked change, or an untracked file too big to record, is +dirty."""
    from study.results import _commit

    def run(name: str, meta: dict, diff: str | None) -> Path:
        d = tmp_path / name
        d.mkdir()
        base = {"git_commit": "9c65b98b60e425a8", "git_untracked_skipped": []}
        (d / "meta.jsonl").write_text(json.dumps({**base, **meta}) + "\n")
        if diff is not None:
            (d / "git.diff").write_text(diff)
        return d

    log = "diff --git a/ladder.log b/ladder.log\nnew file mode 100644\n+x\n"
    code = "diff --git a/optim/core.py b/optim/core.py\n--- a/optim/core.py\n+y\n"
    assert _commit(run("clean", {"git_dirty": False}, None)) == "9c65b98b60e4"
    assert (
        _commit(run("log", {"git_dirty": True, "git_untracked": ["ladder.log"]}, log))
        == "9c65b98b60e4+untracked(ladder.log)"
    )
    both = run("both", {"git_dirty": True, "git_untracked": ["ladder.log"]}, code + log)
    assert _commit(both) == "9c65b98b60e4+dirty"
    big = run(
        "big", {"git_dirty": True, "git_untracked": [], "git_untracked_skipped": ["w.bin"]}, ""
    )
    assert _commit(big) == "9c65b98b60e4+dirty"


def test_a_resumed_run_names_every_commit_it_ran_under(tmp_path: Path) -> None:
    """``commit`` is the session's that last started from step 0 (not an abandoned start's);
    ``resumed`` names each later session's checkpoint step and commit (+dirty, another device),
    and the report's provenance lists those commits too."""
    from study.results import _commit, _resumed
    from study.tables import commits

    d = tmp_path / "run"
    d.mkdir()
    ckpt = str(d / "checkpoints" / "step_0000600.pt")
    sessions = [  # an abandoned start (the run began again from step 0 after it), then the run
        {"git_commit": "901c70d4f6d3a0fb", "git_dirty": True, "gpu": None, "resume_from": None},
        {"git_commit": "076fa3a1092fec33", "git_dirty": False, "gpu": None, "resume_from": None},
        {"same_session": True, "optimizer_routes": {}},  # merged into the session before it
        {"git_commit": "23bc740e86e81c1e", "git_dirty": False, "gpu": None, "resume_from": ckpt},
        {"git_commit": "93b17873aaaa0000", "git_dirty": True, "gpu": "NVIDIA H200",
         "resume_from": str(d / "checkpoints" / "step_0000800")},  # a sharded checkpoint
    ]  # fmt: skip
    (d / "meta.jsonl").write_text("".join(json.dumps(m) + "\n" for m in sessions))
    assert _commit(d) == "076fa3a1092f"
    assert _resumed(d) == "600@23bc740e86e8; 800@93b17873aaaa+dirty on NVIDIA H200"
    (tmp_path / "once").mkdir()
    (tmp_path / "once" / "meta.jsonl").write_text(json.dumps(sessions[1]) + "\n")
    assert _resumed(tmp_path / "once") == ""
    rows = [{"commit": "076fa3a1092f", "resumed": _resumed(d)}, {"commit": "23bc740e86e8"},
            {"commit": "076fa3a1092f", "resumed": "600@23bc740e86e8"}]  # fmt: skip
    assert commits(rows) == [
        "- `076fa3a1092f`: 2 runs", "- `23bc740e86e8`: 1 runs",
        "- `23bc740e86e8`: 2 resumed sessions of runs started under an earlier commit (the "
        "`resumed` column)",
        "- `93b17873aaaa+dirty`: 1 resumed session of runs started under an earlier commit (the "
        "`resumed` column)",
    ]  # fmt: skip


def _ran(run) -> dict[str, float]:  # noqa: ANN001
    """A planned run's optimizer values and seed, from its train.py overrides."""
    ov = dict(o.split("=", 1) for o in run.overrides)
    return {"lr": float(ov["optimizer.lr"]), "wd": float(ov.get("optimizer.weight_decay", 0.1)),
            "seed": int(ov["seed"])}  # fmt: skip


def _finish(run, loss: float, curve: list[float]) -> None:  # noqa: ANN001
    """Write what a finished train.py run leaves: config.yaml (the values it ran with, as
    train.py resolves them), summary.json, metrics.jsonl."""
    run.out_dir.mkdir(parents=True, exist_ok=True)
    ov = dict(o.split("=", 1) for o in run.overrides)
    v = _ran(run)
    cfg = {"max_steps": run.max_steps, "batch_tokens": int(ov["batch_tokens"]), "seed": v["seed"],
           "schedule": {"warmup_steps": int(ov["schedule.warmup_steps"]), "min_lr_ratio": 0.1},
           "optimizer": {"lr": v["lr"], "weight_decay": v["wd"]}, "data": {}}  # fmt: skip
    (run.out_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
    summary = {"steps": run.max_steps, "final_val_loss": loss, "best_val_loss": loss,
               "tokens": run.max_steps * 2048, "elapsed_s": 10.0,
               "optimizer_routes": {"foreach": {"buckets": 2, "reasons": ["r"]},
                                    "engine": {"buckets": 1, "reasons": ["r"]}}}  # fmt: skip
    (run.out_dir / "summary.json").write_text(json.dumps(summary))
    recs = [{"step": 20 * i, "tokens": 0, "train_loss": x, "grad_norm": 1.0, "clip_rate": 0.0,
             "lr": 1e-3} for i, x in enumerate(curve)]  # fmt: skip
    recs.append({"step": run.max_steps, "tokens": 0, "val_loss": loss})
    (run.out_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_a_cell_replayed_from_its_run_directories(tmp_path: Path) -> None:
    """Tuning, evaluation and the swap from run directories alone: the chosen values on every
    evaluation seed, the final lr line's finalists too; then results.csv with the knob columns,
    the collapse flag, the tuning table and curves.csv.gz read back."""
    from study.curves import read_curves, write_curves
    from study.plan import Cell, Plan
    from study.results import collect
    from study.state import Study
    from study.tables import knob_table

    plan = Plan(out=tmp_path, optimizers=["adamw"], models=["proxy-100k"], budgets=[0.25],
                baseline_budgets=[], knobs=["lr", "wd"])  # fmt: skip
    study, cell = Study(plan), Cell("adamw", "proxy-100k", 0.25)

    def loss(run) -> float:  # noqa: ANN001
        v = _ran(run)
        return 2.0 + (math.log2(v["lr"] / 0.008)) ** 2 / 10 + abs(math.log10(v["wd"] / 0.1)) / 10

    for _ in range(100):
        state = study.update(cell)
        if state.done:
            break
        for r in state.pending:
            collapsed = "lr-0.064" in r.out_dir.name
            _finish(r, 2.5 if collapsed else loss(r), [3.0, 2.5, 2.2, 2.1])
    assert state.done and state.chosen == {"lr": 0.008, "wd": 0.1}
    assert state.flags == {"lr": "bracketed", "wd": "bracketed"}
    assert state.swap_values == [0.004, 0.008, 0.016]
    rows, curves = collect(study, floor=2.356)
    evals = [r for r in rows if r["role"] == "eval"]
    assert len(evals) == 15 and sum(r["chosen"] for r in evals) == 5
    assert {r["wd"] for r in rows} >= {0.1, 0.03162, 0.3162}
    assert all(r["collapsed"] == int(r["final_val_loss"] >= 2.356) for r in rows)
    assert any(r["collapsed"] for r in rows) and not all(r["collapsed"] for r in rows)
    for r in rows:  # every value from the run's own config.yaml, not from its directory's name
        cfg = yaml.safe_load((tmp_path / r["run_dir"] / "config.yaml").read_text())
        assert (r["lr"], r["wd"], r["seed"]) == (
            cfg["optimizer"]["lr"],
            cfg["optimizer"]["weight_decay"],
            cfg["seed"],
        )
        assert r["routes"] == "engine:1;foreach:2"  # summary.json's optimizer_routes, counted
    write_curves(curves, tmp_path / "curves.csv.gz")
    back = read_curves(tmp_path / "curves.csv.gz")
    assert set(back) == {r["run_dir"] for r in rows}
    first = back[rows[0]["run_dir"]]
    assert [x["loss"] for x in first if x["kind"] == "train"] == [3.0, 2.5, 2.2, 2.1]
    table = "\n".join(knob_table(rows))
    assert "| adamw | lr |" in table and "0.008 (bracketed)" in table
    from study.report import render
    from study.results import read_csv, write_csv

    write_csv(rows, tmp_path / "results.csv")
    head = (tmp_path / "results.csv").read_text().split("\n", 1)[0]
    assert head.endswith(",run_dir,cpu,routes,dtype,tf32,command")  # issue 64: every row
    write_csv([{k: v for k, v in r.items() if k != "routes"} for r in rows], tmp_path / "old.csv")
    assert "routes" not in (tmp_path / "old.csv").read_text()  # an older ledger: no column
    back_rows = read_csv(tmp_path / "results.csv")
    text = render(back_rows, {"bigram": 2.356, "collapse_floor": 2.356}, [0.25], complete=True)
    for heading in ("## Collapses and medians", "## Every pair, Holm-corrected",
                    "## Selection error", "## Tuning: every knob", "## Provenance"):  # fmt: skip
        assert heading in text
    assert "| proxy-100k | 0.25x | adamw | 0.008 / 0.008 |" in text  # the swap agrees here


def test_a_capped_search_reruns_its_lr_finalists_at_the_final_knobs(tmp_path: Path) -> None:
    """One pass allowed, and the lr's optimum moves with wd (lr* = 0.0008 / wd): the lr line runs
    at wd 0.1 and picks 0.008, then wd moves to 0.0316 and the search is capped. The lr line's
    finalists then run again on the selection seeds at wd 0.0316, so the swap reads both seed
    sets at the final values, and its table says the selection seeds now prefer 0.016."""
    from study.plan import Cell, Plan
    from study.results import collect
    from study.state import Study
    from study.tables import swap_table

    plan = Plan(out=tmp_path, optimizers=["adamw"], models=["proxy-100k"], budgets=[0.25],
                baseline_budgets=[], knobs=["lr", "wd"], max_passes=1)  # fmt: skip
    study, cell = Study(plan), Cell("adamw", "proxy-100k", 0.25)

    def loss(run) -> float:  # noqa: ANN001
        v = _ran(run)
        return (
            2.0 + math.log2(v["lr"] * v["wd"] / 0.0008) ** 2 / 10 + abs(math.log10(v["wd"] / 0.01))
        )

    for _ in range(100):
        state = study.update(cell)
        if state.done:
            break
        for r in state.pending:
            _finish(r, loss(r), [3.0, 2.5, 2.2, 2.1])
    assert state.done and state.chosen == {"lr": 0.008, "wd": 0.03162}
    assert state.flags.get("passes") == "capped" and state.swap_values == [0.004, 0.008, 0.016]
    rows, _ = collect(study, floor=2.356)
    at_final = {(r["lr"], int(r["seed"])) for r in rows
                if r["role"] == "select" and math.isclose(r["wd"], 0.03162)}  # fmt: skip
    assert at_final >= {(lr, s) for lr in state.swap_values for s in plan.select_seeds}
    line = next(x for x in swap_table(rows, [0.25]) if "| adamw |" in x)
    assert "| 0.008 (at the final knobs: 0.016) / 0.016 |" in line


def test_centers_from_another_study_and_the_factorial(tmp_path: Path) -> None:
    """--center-from reads another study's chosen values; the factorial's variants run untuned
    at MARS-AdamW's, a variant that fixes betas leaves the beta2 knob out of its runs."""
    from study.definition import centers_from
    from study.findings.factorial import variants
    from study.plan import Cell, Plan
    from study.results import write_csv
    from study.state import Study

    base = {"model": "proxy-100k", "budget": 1.0, "role": "eval", "chosen": 1, "seed": 1,
            "lr": 0.016, "aux_lr": 0.128, "wd": 0.01, "beta2": 0.99, "warmup": 0.1}  # fmt: skip
    csv = tmp_path / "results.csv"
    write_csv([{**base, "optimizer": "mars-adamw"},
               {**base, "optimizer": "adamw", "lr": 0.008, "beta2": 0.95, "wd": 0.1}], csv)  # fmt: skip
    cells = variants({"beta2": 0.99}, 0.95)
    assert len(cells) == 10 and "mars-adamw:mode=exact" in cells
    assert cells[-1] == "mars-adamw:gamma=0.0528,betas=[0.9,0.95],weight_decay_1d=0.1"
    assert "mars-adamw:gamma=0.0,betas=[0.9,0.95],weight_decay_1d=0.0" in cells
    centers = centers_from(csv, None, cells)
    assert centers[cells[0]] == {"lr": 0.016, "aux_lr": 0.128, "wd": 0.01, "beta2": 0.99,
                                 "warmup": 0.1}  # fmt: skip
    with pytest.raises(ValueError, match="no such file"):
        centers_from(tmp_path / "nope.csv", None, cells)
    opt = "mars-adamw:gamma=0.0,betas=[0.9,0.95],weight_decay_1d=0.0"
    plan = Plan(out=tmp_path / "f", optimizers=[opt], models=["proxy-100k"], budgets=[1.0],
                baseline_budgets=[], untuned=[opt], centers={opt: centers[opt]})  # fmt: skip
    assert plan.keys(Cell(opt, "proxy-100k", 1.0)) == ["lr", "aux_lr", "wd", "warmup"]
    run = Study(plan).update(Cell(opt, "proxy-100k", 1.0)).pending[0]
    assert "optimizer.betas=[0.9,0.95]" in run.overrides and "optimizer.gamma=0.0" in run.overrides
    assert sum(o.startswith("optimizer.betas=") for o in run.overrides) == 1
    assert (
        "optimizer.lr=0.016" in run.overrides and "optimizer.weight_decay_1d=0.0" in run.overrides
    )
    assert "beta2" not in run.out_dir.name and "/eval/" in str(run.out_dir)


def test_dry_run_prints_one_command_per_run_with_the_device(tmp_path: Path, caplog) -> None:  # noqa: ANN001
    """--device cuda --jobs N: N runs at once, each ``device=cuda`` (one GPU shared); each run
    is one train.py command with its own out_dir."""
    import logging

    from study.cli import main

    caplog.set_level(logging.INFO, logger="study")
    out = tmp_path / "s"
    assert main(["--out", str(out), "--optimizers", "adamw", "--budgets", "0.25",
                 "--baseline-budgets", "--knobs", "lr", "--device", "cuda", "--jobs", "2",
                 "--dry-run"]) == 0  # fmt: skip
    cmds = [r.getMessage() for r in caplog.records if r.getMessage().startswith("+ ")]
    assert len(cmds) == 2 and all("device=cuda" in c and "train.py" in c for c in cmds)
    assert all("out_dir=" in c and "/select/lr-" in c for c in cmds)
    assert not (out / "started.txt").exists()


def test_no_run_directory_is_committed_and_none_can_be() -> None:
    """The studies keep ledgers, not run directories (study/ledger.py): no tracked file lies in
    a ``runs/`` folder, ``runs/`` is ignored everywhere (results/ too), and no committed results
    file holds a machine's absolute path."""
    import shutil
    import subprocess

    root = Path(__file__).resolve().parents[1]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True,
                             check=True).stdout.split()  # fmt: skip
    assert not [f for f in tracked if "/runs/" in f or f.startswith("runs/")]
    for path in ("runs/referee/x", "results/referee/batch/runs/proxy-100k/x/summary.json"):
        ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=root, check=False)
        assert ignored.returncode == 0, f"{path} is not ignored by git"
    for f in tracked:
        if f.startswith("results/") and f.endswith((".csv", ".md", ".txt", ".json")):
            text = (root / f).read_text(errors="replace")
            assert not re.search(r"(?<![\w.])/(?:work|root|home|tmp|Users)/", text), f


def test_factorial_effects_recover_planted_factors() -> None:
    """Planted losses L = 1.8 + 0.06 g + 0.03 b + 0.005 d + seed noise over the eight corners, AdamW
    0.02 below the all-AdamW corner: each switch and main effect is its planted size, the
    residual 0.02, the shares add up, exact, batch and the kappa-held betas read as switches; a
    missing corner: None."""
    from study.findings.factorial import BASE, chosen_pair, corners, effects, markdown, variants

    chosen = {"optimizer": BASE, "role": "eval", "chosen": 1.0, "beta2": 0.99, "model": "m",
              "budget": 1.0}  # fmt: skip
    names = corners(chosen, 0.95)
    assert names[(True, True, True)] == BASE and len(set(names.values())) == 8
    assert (
        names[(False, True, True)] == "mars-adamw:gamma=0.0,betas=[0.95,0.99],weight_decay_1d=0.1"
    )
    rows, noise = [], {1: 0.01, 2: -0.02, 3: 0.03, 4: 0.0, 5: -0.01}
    for (g, b, d), name in names.items():
        for s, e in noise.items():
            loss = 1.8 + 0.06 * g + 0.03 * b + 0.005 * d + e
            rows.append({**chosen, "optimizer": name, "seed": float(s), "final_val_loss": loss})
    for s, e in noise.items():
        rows.append({"optimizer": "adamw", "role": "eval", "chosen": 1.0, "beta2": 0.95,
                     "seed": float(s), "final_val_loss": 1.8 - 0.02 + e, "model": "m",
                     "budget": 1.0})  # fmt: skip
        # AdamW's baseline budget in the same results.csv (its carried beta2 blank): not the gap's
        rows.append({"optimizer": "adamw", "role": "eval", "chosen": 1.0, "beta2": "",
                     "seed": float(s), "final_val_loss": 1.5 + e, "model": "m", "budget": 2.0})  # fmt: skip
    exact, batch, held = variants(chosen, 0.95)[7:]
    for s, e in noise.items():
        rows.append(
            {**chosen, "optimizer": exact, "seed": float(s), "final_val_loss": 1.8 + 0.05 + e}
        )
        rows.append(
            {**chosen, "optimizer": held, "seed": float(s), "final_val_loss": 1.8 + 0.07 + e}
        )
    eff = effects(rows)
    assert eff is not None
    picked = chosen_pair(rows[::-1])  # the 2x rows first: still AdamW at MARS-AdamW's budget
    assert picked is not None and picked[1]["budget"] == 1.0 and picked[1]["beta2"] == 0.95
    assert eff["gap: MARS-AdamW - AdamW"].mean == pytest.approx(0.115)
    for name, size in (("gamma", 0.06), ("betas", 0.03), ("gains' weight decay", 0.005)):
        assert eff[f"switch {name} alone"].mean == pytest.approx(size)
        assert eff[f"main effect of {name}"].mean == pytest.approx(size)
        assert eff[f"switch {name} alone"].hi - eff[f"switch {name} alone"].lo == pytest.approx(0)
    assert eff["residual: all three at AdamW's - AdamW"].mean == pytest.approx(0.02)
    assert eff["switch all three"].mean + 0.02 == pytest.approx(0.115)
    assert eff["switch to exact mode"].mean == pytest.approx(0.045)
    assert "switch to batch 8,192 tokens" not in eff  # no rows for it
    assert eff["switch betas alone, kappa held"].mean == pytest.approx(0.025)
    table = markdown(rows)
    assert "| switch gamma alone | +0.0600 [+0.0600, +0.0600] | 5 | +52% |" in table
    partial = [r for r in rows if r["optimizer"] != names[(False, False, False)]]
    assert effects(partial) is None and "incomplete" in markdown(partial)


def test_swap_table_gives_each_optimizers_gap_to_adamw_both_ways() -> None:
    """Two lr finalists per optimizer on both seed sets: the gap column is the optimizer's
    swapped means minus AdamW's (a lookup by the wrong key once printed "reference" for all)."""
    from study.tables import swap_table

    rows = []
    for opt, base in (("adamw", 1.5), ("mars-adamw", 1.8)):
        for lr, shift, chosen in ((0.01, 0.0, 1.0), (0.02, 0.1, 0.0)):
            for role, seeds, bump in (("select", (0, 6, 7), 0.0), ("eval", (1, 2), 0.05)):
                for s in seeds:
                    rows.append({"model": "m", "budget": 1.0, "optimizer": opt, "role": role,
                                 "chosen": chosen if role == "eval" else 0.0, "lr": lr,
                                 "seed": float(s), "grid": "lr:bracketed", "aux_lr": 0.1,
                                 "final_val_loss": base + shift + bump})  # fmt: skip
    lines = swap_table(rows, [1.0])
    assert lines[-2].endswith("| adamw | 0.01 / 0.01 | 1.5500, 1.5000 | reference | -0.0500 |")
    assert lines[-1].endswith(
        "| mars-adamw | 0.01 / 0.01 | 1.8500, 1.8000 | +0.3000, +0.3000 | -0.0500 |"
    )


def test_the_floors_prepare_the_embedded_corpus_in_a_fresh_clone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh clone whose runs are all restored reports without training: the floors prepare
    the embedded corpus in its default directory, as train.py does, and refuse any other
    directory without shards with the command that prepares it."""
    from data.config import DataConfig
    from study.floors import ngram_losses

    monkeypatch.chdir(tmp_path)
    data = DataConfig(name="sotu", dir="data/shards/sotu-bytes", tokenizer="bytes",
                      val_fraction=0.02)  # fmt: skip
    floors = ngram_losses(data)
    assert floors["val_tokens"] == 217_503  # 5 speeches (docs/study.md)
    assert floors["bigram"] == pytest.approx(2.356, abs=5e-4)
    assert floors["unigram"] == pytest.approx(3.013, abs=5e-4)
    with pytest.raises(FileNotFoundError, match="python -m data.prepare sotu"):
        ngram_losses(DataConfig(name="sotu", dir="elsewhere", tokenizer="bytes"))


def test_the_report_names_missing_data_in_one_line(tmp_path: Path) -> None:
    """Runs whose data directory is gone: the report stops with the command that prepares it,
    not a traceback."""
    from types import SimpleNamespace as NS

    from study.report import write_report

    run = tmp_path / "runs" / "proxy-100k" / "1x" / "adamw" / "eval" / "lr-0.008_seed-1"
    run.mkdir(parents=True)
    data = {"name": "sotu", "dir": str(tmp_path / "gone"), "tokenizer": "bytes"}
    (run / "config.yaml").write_text(yaml.safe_dump({"data": data}))
    with pytest.raises(
        SystemExit, match="collapse floor needs the runs' data.*python -m data.prepare"
    ):
        write_report(NS(plan=NS(out=tmp_path)))


def _bowl(v: dict) -> float:
    """A loss with its minimum at lr 0.008, wd 0.1."""
    return 2.0 + math.log2(v["lr"] / 0.008) ** 2 / 10 + abs(math.log10(v["wd"] / 0.1)) / 10


def _schedule(study, monkeypatch, pool, flight: list, loss) -> None:  # noqa: ANN001
    """study/scheduler.py with two slots, run to the end: ``pool.submit`` starts a run (it
    appends ``(future, run)`` to ``flight``); the oldest run in flight ends first, at
    ``loss(its values)``."""
    import argparse

    from study import scheduler

    def wait(running, return_when):  # noqa: ANN001, ANN202
        fut, run = flight.pop(0)
        _finish(run, loss(_ran(run)), [3.0, 2.5, 2.2])
        fut.set_result((0, ""))
        return {fut}, set(running) - {fut}

    monkeypatch.setattr(scheduler, "wait", wait)
    args = argparse.Namespace(jobs=2, launcher="local", nproc=1, threads=1, dry_run=False)
    study.warned = set()
    scheduler._keep_running(study, args, pool, {})


def test_the_scheduler_starts_the_earliest_cell_that_a_finished_run_unblocked(
    tmp_path, monkeypatch
):
    """Two slots, two cells: whenever a slot frees, the first cell in the plan's order with a run
    waiting (pending, not in flight) goes first, so AdamW's evaluation seeds start as soon as its
    last selection run ends, not after MARS-AdamW's runs queued while AdamW waited on it; both
    slots are busy most of the time; no run starts twice; every cell ends done."""
    from concurrent.futures import Future

    from study.plan import Cell, Plan
    from study.state import Study

    plan = Plan(out=tmp_path, optimizers=["adamw", "mars-adamw"], models=["proxy-100k"],
                budgets=[0.25], baseline_budgets=[], knobs=["lr", "wd"])  # fmt: skip
    study = Study(plan)
    cells = [Cell("adamw", "proxy-100k", 0.25), Cell("mars-adamw", "proxy-100k", 0.25)]
    running_order: list = []  # (future, run), oldest first: the runs in flight
    started: list = []
    in_flight: list = []  # how many runs were in flight after each start

    def waiting(cell) -> list:  # noqa: ANN001
        flight = {r.out_dir for _, r in running_order}
        return [r for r in study.update(cell).pending if r.out_dir not in flight]

    class Pool:
        def submit(self, fn, cmds, **kw):  # noqa: ANN001, ANN003, ANN201
            run = next(r for c in cells for st in [study.update(c)] for r in st.pending + st.ahead
                       if str(r.out_dir) in " ".join(map(str, cmds[0])))  # fmt: skip
            cell = cells[0] if "/adamw/" in str(run.out_dir) else cells[1]
            earlier = waiting(cells[0]) if cell == cells[1] else []
            started.append((cell.optimizer, run.out_dir, [r.out_dir for r in earlier]))
            fut: Future = Future()
            running_order.append((fut, run))
            in_flight.append(len(running_order))
            return fut

    _schedule(study, monkeypatch, Pool(), running_order, _bowl)
    assert all(study.update(c).done for c in cells)
    dirs = [d for _, d, _ in started]
    assert len(dirs) == len(set(dirs))  # no run started twice
    assert max(in_flight) == 2 and in_flight.count(2) > len(in_flight) // 2
    assert all(not earlier for opt, _, earlier in started if opt == "mars-adamw"), [
        (opt, d.name, [e.name for e in earlier]) for opt, d, earlier in started if earlier
    ]
    # AdamW's evaluation seeds start before MARS-AdamW's last selection runs, not after them
    first_eval = next(
        i for i, (o, d, _) in enumerate(started) if o == "adamw" and "/eval/" in str(d)
    )
    assert any(o == "mars-adamw" and "/select/" in str(d) for o, d, _ in started[first_eval:])


def test_a_slot_that_would_idle_runs_the_line_s_likely_finalists_and_no_choice_changes(
    tmp_path, monkeypatch
):
    """One cell, two slots: while the lr line waits on its last first-seed value, the other slot
    runs the present finalists on the other selection seeds (study/tuner.py's ``ahead``) rather
    than idling; the choice is the one the tuner makes from the same losses run one at a time."""
    from concurrent.futures import Future

    from study.plan import Cell, Plan
    from study.state import Study
    from study.tuner import tune

    def loss(v: dict) -> float:
        return _bowl(v) + v["seed"] / 1000

    plan = Plan(out=tmp_path, optimizers=["adamw"], models=["proxy-100k"], budgets=[0.25],
                baseline_budgets=[], knobs=["lr", "wd"], swap=False)  # fmt: skip
    study = Study(plan)
    cell = Cell("adamw", "proxy-100k", 0.25)
    flight: list = []  # (future, run, started while nothing else was pending)
    looked_ahead: list = []

    class Pool:
        def submit(self, fn, cmds, **kw):  # noqa: ANN001, ANN003, ANN201
            st = study.update(cell)
            run = next(r for r in st.pending + st.ahead if str(r.out_dir) in " ".join(cmds[0]))
            if run in st.ahead:
                looked_ahead.append(_ran(run))
            fut: Future = Future()
            flight.append((fut, run))
            return fut

    _schedule(study, monkeypatch, Pool(), flight, loss)
    state = study.update(cell)
    assert state.done and looked_ahead
    assert all(v["seed"] in (6, 7) for v in looked_ahead)
    alone = tune(plan.keys(cell), study.start(cell), plan.select_seeds,
                 lambda p, s: loss({**p, "seed": s}), finalists=plan.finalists, cap=plan.cap,
                 max_passes=plan.max_passes)  # fmt: skip
    assert state.chosen == alone.chosen


def test_with_one_tuned_key_an_idle_slot_runs_the_evaluation_seeds_at_the_likely_choice(
    tmp_path, monkeypatch
):
    """One cell tuning the lr alone, two slots: while the line waits on its last run in flight
    and no selection run is left to look ahead to, the other slot starts an evaluation seed at
    the value the line leans to (study/tuner.py's ``likely``); every evaluation run lands at the
    lr the tuner chooses from the same losses one at a time, and no run starts twice."""
    from concurrent.futures import Future

    from study.plan import Cell, Plan
    from study.state import Study
    from study.tuner import tune

    def loss(v: dict) -> float:
        return _bowl(v) + v["seed"] / 1000

    plan = Plan(out=tmp_path, optimizers=["adamw"], models=["proxy-100k"], budgets=[0.25],
                baseline_budgets=[], knobs=["lr"], swap=False)  # fmt: skip
    study = Study(plan)
    cell = Cell("adamw", "proxy-100k", 0.25)
    flight: list = []
    started: list = []  # (run, the tuner still waiting when it started)

    class Pool:
        def submit(self, fn, cmds, **kw):  # noqa: ANN001, ANN003, ANN201
            st = study.update(cell)
            run = next(r for r in st.pending + st.ahead if str(r.out_dir) in " ".join(cmds[0]))
            started.append((run, st.tuned is not None and bool(st.tuned.pending)))
            fut: Future = Future()
            flight.append((fut, run))
            return fut

    _schedule(study, monkeypatch, Pool(), flight, loss)
    state = study.update(cell)
    assert state.done
    alone = tune(plan.keys(cell), study.start(cell), plan.select_seeds,
                 lambda p, s: loss({"wd": 0.1, **p, "seed": s}), finalists=plan.finalists, cap=plan.cap,
                 max_passes=plan.max_passes)  # fmt: skip
    assert state.chosen == alone.chosen
    evals = [(r, waiting) for r, waiting in started if "/eval/" in str(r.out_dir)]
    assert len(evals) == len(plan.eval_seeds)
    assert any(waiting for _, waiting in evals)  # one started before the choice was made
    assert all(_ran(r)["lr"] == state.chosen["lr"] for r, _ in evals)
    dirs = [r.out_dir for r, _ in started]
    assert len(dirs) == len(set(dirs))
