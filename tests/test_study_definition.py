"""A study defined as data (study/definition.py, study/parts.py, study/studies/*.yaml): each
referee part builds the Plan of the very command scripts/study_referee.sh ran (so every run id and
published number stays the same), the crossover's the Plan of the flag command its sweep ran, bad
definitions are refused in one line, and `run`/`publish` restore, order and publish as the
script did."""

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT
from study import cli, parts
from study import definition as defs
from study.definition import DefinitionError

OPTS = ["adamw", "mars-adamw", "muon", "mars-m", "moonlight"]
CENTERS = [a for c in ("adamw:lr=0.008", "adamw:aux_lr=0.256", "mars-adamw:lr=0.016",
                       "mars-adamw:aux_lr=0.128", "muon:lr=0.032", "muon:aux_lr=0.016",
                       "mars-m:lr=0.032", "mars-m:aux_lr=0.032", "moonlight:lr=0.032",
                       "moonlight:aux_lr=0.032") for a in ("--center", c)]  # fmt: skip
LADDER = "results/referee/ladder/results.csv"
# The arguments scripts/study_referee.sh (at 4bfc94be) gave each part, captured by running it
# with a stand-in `python` that recorded its argv (OUT=runs/referee, JOBS=2): the known answers.
SCRIPT = {
    "headline": ["--out", "runs/referee", "--optimizers", *OPTS, "--models", "proxy-100k",
                 "--budgets", "1", "--baseline-budgets", "2", "4", *CENTERS],
    "factorial": ["--from", "runs/referee/results.csv", "--out", "runs/referee-factorial"],
    "ladder": ["--out", "runs/referee-ladder", "--optimizers", *OPTS, "--models", "proxy-100k",
               "--budgets", "0.25", "--baseline-budgets", "2", "4", *CENTERS],
    "ladder-up": ["--out", "runs/referee-ladder-up", "--optimizers", *OPTS, "--models",
                  "proxy-193k", "proxy-423k", "--budgets", "0.25", "--baseline-budgets", "2",
                  "4", "--knobs", "lr", "aux_lr", "--center-from", LADDER, "--center-cell",
                  "proxy-100k:0.25", "--merge", LADDER, "--no-swap"],
    "widthinit": ["--out", "runs/referee-widthinit", "--optimizers", *OPTS, "--models",
                  "proxy-100k", "--budgets", "0.25", "--baseline-budgets", "2", "4",
                  "--center-from", LADDER, "--center-cell", "proxy-100k:0.25"],
    "batch": ["--out", "runs/referee-batch", "--optimizers", "adamw", "mars-adamw", "--models",
              "proxy-100k", "--budgets", "1", "--baseline-budgets", "--batch-tokens", "8192",
              "--center-from", "results/referee/headline/results.csv", "--center-cell",
              "proxy-100k:1"],
}  # fmt: skip
TAIL = {"widthinit": ["--", "model.init_std=0.098"]}
RUN = ["--jobs", "2", "--threads", "1"]
SCRIPT_COMPARE = [
    ["0.25x=results/referee/ladder/results.csv@proxy-100k:0.25",
     "1x=results/referee/headline/results.csv@proxy-100k:1", "--out",
     "results/referee/compare/budget.md", "--figure", "results/referee/compare/budget.png"],
    ["default=results/referee/ladder/results.csv@proxy-100k:0.25",
     "width-aware=results/referee/widthinit/results.csv@proxy-100k:0.25", "--out",
     "results/referee/compare/init.md", "--figure", "results/referee/compare/init.png"],
    ["ladder=results/referee/ladder-up/results.csv", "--out", "results/referee/compare/sizes.md",
     "--figure", "results/referee/compare/sizes.png"],
    ["2048=results/referee/headline/results.csv@proxy-100k:1",
     "8192=results/referee/batch/results.csv@proxy-100k:1", "--out",
     "results/referee/compare/batch.md", "--figure", "results/referee/compare/batch.png"],
]  # fmt: skip


@pytest.fixture(scope="module")
def referee():
    return defs.load("referee")


@pytest.fixture(autouse=True)
def _from_the_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # the definitions and the commands name their files from there


def flags(argv):
    """The Plan the flag command ``python -m study ARGV`` builds."""
    return cli.plan_of(*cli.parse(argv))


@pytest.mark.parametrize("name", [n for n in SCRIPT if n != "factorial"])
def test_each_part_builds_the_plan_of_the_scripts_very_command(referee, name):
    part = referee.parts[name]
    tail = TAIL.get(name, [])
    plan = defs.plan_of(part, referee.parts, {"jobs": 2, "threads": 1})
    assert plan == flags(SCRIPT[name] + RUN + tail)
    assert defs.plan_of(part, referee.parts, {"report_only": True}) == (
        flags(SCRIPT[name] + ["--report-only"] + tail)
    )
    # the command it logs builds it again
    assert flags(cli.command_line(plan, set(part.values))) == plan
    assert cli.command_line(plan, set(part.values)) == SCRIPT[name] + RUN + tail


def test_the_factorial_part_reads_the_headlines_run_tree(referee, monkeypatch):
    from study.findings import factorial

    seen = []

    def fields(source):
        seen.append(source)
        return {"optimizers": ["adamw"], "budgets": [1.0], "baseline_budgets": []}

    monkeypatch.setattr(factorial, "fields", fields)
    monkeypatch.setattr(cli, "run", lambda plan, argv=None: seen.append(plan) or 0)
    assert parts.run_part(referee.parts["factorial"], referee, {"jobs": 2}, False) == 0
    assert seen[0] == Path(SCRIPT["factorial"][1])
    assert seen[1].out == ROOT / SCRIPT["factorial"][3] and seen[1].optimizers == ["adamw"]
    with pytest.raises(
        ValueError, match="a factorial's cells come from study/findings/factorial.py"
    ):
        defs.plan_of(referee.parts["factorial"], referee.parts)


def test_the_flag_commands_defaults_are_the_plans():
    """Each default stated once (study/plan.py): the flag command's and `run`'s --jobs (2)."""
    bare = flags([])
    fields = {f.name for f in dataclasses.fields(bare) if f.init} - {"out", "start_values"}
    assert {k: getattr(bare, k) for k in fields} == {k: cli.DEFAULTS[k] for k in fields}
    assert bare.jobs == 2 == parts.parse(["run", "referee"]).jobs
    assert bare.out == ROOT / "runs" / "study"


def test_run_without_parts_is_the_scripts_all(referee):
    """The script's `all`: headline, ladder, widthinit, ladder-up's comparison cells (its
    baseline budgets emptied), batch, then ladder-up whole: the same studies."""
    got = [(n, defs.plan_of(referee.parts[n], referee.parts, {"jobs": 2}, main_only=m))
           for n, m in defs.ordered(referee, [])]  # fmt: skip
    assert [n for n, _ in got] == ["headline", "ladder", "widthinit", "ladder-up", "batch",
                                   "ladder-up"]  # fmt: skip
    want = [SCRIPT[n] + RUN + TAIL.get(n, []) for n, _ in got]
    want[3] = SCRIPT["ladder-up"] + RUN + ["--baseline-budgets"]  # as the script wrote it
    assert [p for _, p in got] == [flags(a) for a in want]
    assert got[3][1].baseline_budgets == [] and got[5][1].baseline_budgets == [2.0, 4.0]


def test_the_comparisons_are_the_scripts(referee):
    assert [defs.compare_args(referee, n) for n in referee.compare] == SCRIPT_COMPARE


def test_named_parts_run_in_the_definitions_order(referee):
    assert defs.ordered(referee, ["batch", "ladder-up", "ladder"]) == [
        ("ladder", False), ("ladder-up", False), ("batch", False)]  # fmt: skip
    with pytest.raises(DefinitionError, match=r"--part nope: no such part of referee \(head"):
        defs.ordered(referee, ["nope"])


def test_the_crossover_definition_gives_the_plans_the_sweep_ran():
    """Each batch part runs the study that `python -m study crossover run` ran before the
    crossover became a definition (its command captured for 8,192 bytes; its files in
    runs/crossover/b<B> and results/crossover/b<B>/): the b8192 part's Plan is that command's."""
    d = defs.load("crossover")
    assert list(d.parts) == ["b8192", "b2048", "b32768", "b131072", "b524288", "b131072-fp32",
                             "m423k-b8192", "m423k-b131072", "corr-b2048", "chain-b2048",
                             "corr-split-b2048", "chain-b8192", "nodecay-b2048", "nodecay-b8192",
                             "corr-b8192",
                             "corr-b32768", "rep-b8192"]  # fmt: skip
    ran = ["--out", "runs/crossover/b8192", "--optimizers", "adamw", "mars-adamw",
           "mars-adamw:gamma=0", "--models", "proxy-100k", "--budgets", "4",
           "--baseline-budgets", "--batch-tokens", "8192", "--knobs", "lr", "--center-from",
           "results/referee/batch/results.csv", "--center-cell", "proxy-100k:1", "--no-swap",
           "--jobs", "2", "--threads", "1", "--", "ckpt_every=100"]  # fmt: skip
    plan = defs.plan_of(d.parts["b8192"], d.parts, {"jobs": 2, "threads": 1})
    assert plan == flags(ran)
    assert plan.out == ROOT / "runs" / "crossover" / "b8192"
    assert plan.start_values["mars-adamw:gamma=0"] == plan.start_values["mars-adamw"]
    gpu = defs.plan_of(d.parts["b8192"], d.parts, {"overrides": ["micro_batch_size=2048"]})
    assert gpu.extra == ["ckpt_every=100", "micro_batch_size=2048"]  # `run --set`: after
    for b in (8192, 2048, 32768, 131072):
        part = d.parts[f"b{b}"]
        assert part.runs == Path(f"runs/crossover/b{b}")
        assert part.results == Path(f"results/crossover/b{b}")


def write(tmp_path, text):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return str(path)


GOOD = "study: s\nparts:\n  a: {budgets: [1]}\n"
BAD = [
    ("study: s\nparts:\n  a: {budget: [1]}\n", "part a: unknown key 'budget'; a part has kind"),
    (
        "study: s\nparts:\n  a: {center_from: b@m:1}\n  b: {}\n",
        "part a starts from b: list b first",
    ),
    ("study: s\nparts:\n  a: {merge: [zz]}\n", "part a starts from 'zz': no such part (a)"),
    ("study: s\nparts:\n  a: {center_from: 'b@@1'}\n", "write PART, PART@MODEL:BUDGET or"),
    ("study: s\nparts:\n  a: {runs: /abs/a}\n", "runs: /abs/a: a path inside the checkout"),
    ("study: s\nparts:\n  a: {kind: factorial}\n", "a factorial says from: PART"),
    ("study: s\nparts:\n  a: {kind: sweep}\n", "kind 'sweep': one of study, factorial"),
    ("study: s\nparts:\n  a: {}\ncompare:\n  x: [l=b]\n", "compare: x: 'l=b': write LABEL=PART"),
    ("study: s\nparts:\n  a: {}\norder: [b]\n", "order: 'b': not a part (a)"),
    ("study: s\nparts:\n  a: {}\norder: [[a]]\n", "order: ['a']: not a part (a)"),
    ("study: s\nparts:\n  a: [1]\n", "part a: a mapping of its keys"),
    ("study: s\ndefaults: [1]\nparts:\n  a: {}\n", "defaults: a mapping of a part's keys"),
    ("study: S\nparts:\n  a: {}\n", "study: 'S': a lower-case name"),
    ("study: s\npart:\n  a: {}\n", "a definition is a mapping with study: NAME and parts"),
    ("study: s\nparts: [\n", "not YAML"),
    (
        "study: s\nparts:\n  a: {budgets: 1}\n",
        "budgets: 1: a list of numbers, e.g. budgets: [0.25]",
    ),
    ("study: s\nparts:\n  a: {budgets: [one]}\n", "budgets: ['one']: a list of numbers"),
    ("study: s\nparts:\n  a: {optimizers: adamw}\n", "optimizers: 'adamw': a list of names"),
    ("study: s\nparts:\n  a: {batch_tokens: 8k}\n", "batch_tokens: '8k': a positive whole"),
    ("study: s\nparts:\n  a: {centers: [adamw]}\n", "centers: a mapping OPT: {KNOB: VALUE}"),
    ("study: s\nparts:\n  a: {swap: no-thanks}\n", "swap: 'no-thanks': true or false"),
    (
        "study: s\nparts:\n  a: {}\n  b: {merge: [a]}\norder: [b, a]\n",
        "order: b starts from a: put a first",
    ),
]


@pytest.mark.parametrize(("text", "line"), BAD)
def test_a_bad_definition_is_refused_in_one_line(tmp_path, text, line):
    with pytest.raises(DefinitionError) as exc:
        defs.load(write(tmp_path, text))
    msg = str(exc.value)
    assert msg.startswith("s.yaml: ") and line in msg and "\n" not in msg


def test_a_part_goes_to_runs_and_results_of_its_study_by_default(tmp_path):
    d = defs.load(write(tmp_path, GOOD))
    assert (d.parts["a"].runs, d.parts["a"].results) == (Path("runs/s/a"), Path("results/s/a"))
    moved = defs.load(write(tmp_path, GOOD), tmp_path / "elsewhere")
    assert moved.parts["a"].runs == tmp_path / "elsewhere" / "s" / "a"
    with pytest.raises(SystemExit, match="study: no study 'nope': name one of study/studies/"):
        parts.main(["run", "nope"])


TWO = "study: s\nparts:\n  a: {budgets: [1]}\n  b: {center_from: a@m:1}\n"


def _tree(root: Path) -> None:
    pub = root / "results" / "s" / "a"
    pub.mkdir(parents=True)
    for name in ("results.csv", "curves.csv.gz", "started.txt", "report.md"):
        (pub / name).write_text(f"published {name}\n")
    (root / "runs" / "s" / "a").mkdir(parents=True)
    (root / "runs" / "s" / "a" / "started.txt").write_text("the tree's own\n")


def test_run_restores_runs_each_part_in_order_and_publishes(tmp_path, monkeypatch):
    _tree(tmp_path)
    calls = []

    def fake(part, definition, options, main_only):
        calls.append((part.name, options["report_only"]))
        part.runs.mkdir(parents=True, exist_ok=True)
        (part.runs / "report.md").write_text(f"report of {part.name}\n")
        return 0

    monkeypatch.setattr(parts, "run_part", fake)
    yaml_file = write(tmp_path, TWO)
    assert parts.main(["run", yaml_file, "--part", "b", "a"], root=tmp_path) == 0
    assert calls == [("a", False), ("b", False)]
    tree, pub = tmp_path / "runs" / "s" / "a", tmp_path / "results" / "s" / "a"
    assert (tree / "results.csv").read_text() == "published results.csv\n"  # restored
    assert (tree / "started.txt").read_text() == "the tree's own\n"  # never over the tree's
    assert not (tree / "report.md").read_text().startswith("published")  # not restored
    assert (pub / "report.md").read_text() == "report of a\n"  # published
    assert (pub / "started.txt").read_text() == "the tree's own\n"
    assert (tmp_path / "results" / "s" / "b" / "report.md").is_file()


def test_report_only_skips_parts_that_never_ran_and_publishes_nothing(tmp_path, monkeypatch):
    _tree(tmp_path)
    calls = []
    monkeypatch.setattr(parts, "run_part", lambda p, d, o, m: calls.append(p.name) or 0)
    yaml_file = write(tmp_path, TWO)
    assert parts.main(["run", yaml_file, "--report-only"], root=tmp_path) == 0
    assert calls == ["a"]  # b has no ledger and no runs
    assert (tmp_path / "results" / "s" / "a" / "report.md").read_text().startswith("published")
    assert parts.main(["publish", yaml_file], root=tmp_path) == 0
    assert calls == ["a", "a"]


def test_a_failing_part_stops_the_run_before_the_next(tmp_path, monkeypatch):
    _tree(tmp_path)
    calls = []
    monkeypatch.setattr(parts, "run_part", lambda p, d, o, m: calls.append(p.name) or 3)
    assert parts.main(["run", write(tmp_path, TWO)], root=tmp_path) == 3
    assert calls == ["a"] and not (tmp_path / "results" / "s" / "b").exists()


def test_a_dry_run_of_the_referees_batch_part_on_a_scratch_copy(tmp_path, capsys):
    """The real command, no training: the batch part's published ledger read where it is
    (complete: nothing to run), nothing restored, written or published (issue 66)."""
    for name in ("headline", "batch"):
        shutil.copytree(
            ROOT / "results" / "referee" / name, tmp_path / "results" / "referee" / name
        )
    before = sorted(p.name for p in (tmp_path / "results" / "referee" / "batch").iterdir())
    assert parts.main(["run", "referee", "--part", "batch", "--dry-run"], root=tmp_path) == 0
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing
    assert sorted(p.name for p in (tmp_path / "results" / "referee" / "batch").iterdir()) == before


def test_the_options_reach_the_plan():
    part = defs.load("crossover").parts["b2048"]
    opts = {"jobs": 4, "threads": 2, "device": "cuda", "dry_run": True, "allow_dirty": True}
    plan = defs.plan_of(part, {"b2048": part}, opts)
    assert (plan.jobs, plan.threads, plan.device, plan.dry_run, plan.allow_dirty) == (
        4,
        2,
        "cuda",
        True,
        True,
    )
    assert plan.extra == ["ckpt_every=100"]
    assert plan.train_overrides == ["device=cuda", "ckpt_every=100"]
    with pytest.raises(ValueError, match="--jobs 0: at least 1"):
        defs.plan_of(part, {"b2048": part}, {"jobs": 0})


def test_a_new_part_key_is_a_plan_field():
    """Every part key but a part's own is a Plan field of the same name (``overrides``: its
    ``extra``), and the lists are checked by the Plan's types."""
    plan_keys = set(defs.PART_KEYS) - set(defs.OWN_KEYS) - {"overrides"}
    assert plan_keys <= set(defs.PLAN_FIELDS)
    assert defs.LISTS["budgets"] == (int, float) and defs.LISTS["select_seeds"] == (int,)
    assert defs.LISTS["merge_only"] == defs.LISTS["optimizers"] == (str,)


def test_a_stop_names_the_study_command_that_continues(tmp_path, monkeypatch):
    _tree(tmp_path)

    def stopped(plan, argv=None):
        raise SystemExit("study: stopped; 1 of 2 cells complete, 1 run(s) in flight asked to "
                         "checkpoint and stop; the same command continues: python -m study --out x")  # fmt: skip

    monkeypatch.setattr(cli, "run", stopped)
    yaml_file = write(tmp_path, TWO)
    with pytest.raises(SystemExit) as exc:
        parts.main(["run", yaml_file, "--jobs", "3"], root=tmp_path)
    assert str(exc.value) == (
        "study: stopped; 1 of 2 cells complete, 1 run(s) in flight asked to checkpoint and stop "
        f"(part a); the same command continues: python -m study run {yaml_file} --jobs 3"
    )
    assert not (tmp_path / "results" / "s" / "a" / "report.md").read_text().startswith("report")


def test_compare_runs_the_comparisons_whose_published_files_are_there(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(parts.compare, "main", lambda argv: calls.append(argv) or 0)
    for name in ("headline", "batch"):
        pub = tmp_path / "results" / "referee" / name
        pub.mkdir(parents=True)
        (pub / "results.csv").write_text("optimizer\n")
    assert parts.main(["compare", "referee"], root=tmp_path) == 0
    assert calls == [SCRIPT_COMPARE[3]]  # batch alone: the others wait for ladder, widthinit


def test_python_m_study_dispatches_the_study_commands_and_keeps_the_flags():
    out = subprocess.run([sys.executable, "-m", "study", "run", "nope"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 1 and out.stderr.startswith("study: no study 'nope'")
    out = subprocess.run([sys.executable, "-m", "study", "--jobs", "0"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 1 and "study: --jobs 0: at least 1" in out.stderr


def test_publish_without_parts_reports_every_part_once_whole(tmp_path, monkeypatch):
    """As the script's publish: every part in the file's order, ladder-up once and with its
    baseline budgets (the order's staging is for runs), the factorial too."""
    calls = []

    def fake(part, definition, options, main_only):
        calls.append((part.name, main_only, options["report_only"]))
        return 0

    monkeypatch.setattr(parts, "run_part", fake)
    for name in ("headline", "factorial", "ladder", "ladder-up", "widthinit", "batch"):
        (
            tmp_path / "runs" / ("referee" if name == "headline" else f"referee-{name}") / "runs"
        ).mkdir(parents=True)
    assert parts.main(["publish", "referee"], root=tmp_path) == 0
    assert calls == [(n, False, True) for n in ("headline", "factorial", "ladder", "ladder-up",
                                                "widthinit", "batch")]  # fmt: skip
