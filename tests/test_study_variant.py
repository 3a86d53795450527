"""A study's optimizer names parsed once (study/variant.py): the parts, the round trip, the
refusals, and every name the committed ledgers hold."""

import csv

import pytest

from helpers import ROOT
from study.plan import dir_name, split_variant, variant_tuned
from study.variant import Variant


def test_a_variant_has_its_base_options_tunings_and_run_settings():
    v = Variant.parse("mars-adamw:betas=[0.9,0.95],eps=tuned,batch_tokens=8192,gamma=0")
    assert v.base == "mars-adamw"
    assert v.fixed == (("betas", "[0.9,0.95]"), ("gamma", "0"))
    assert v.tuned == ("eps",)
    assert v.run == (("batch_tokens", "8192"),)
    assert v.batch_tokens == 8192
    assert v.overrides == ["optimizer.betas=[0.9,0.95]", "batch_tokens=8192", "optimizer.gamma=0"]
    assert v.override_keys == {"optimizer.betas", "batch_tokens", "optimizer.gamma"}
    assert v.dir_name == "mars-adamw@betas-0.9_0.95_eps-tuned_batch_tokens-8192_gamma-0"
    plain = Variant.parse("adamw")
    assert plain == Variant("adamw") and plain.options == () and plain.batch_tokens is None
    assert plain.overrides == [] and plain.name == "adamw" and plain.dir_name == "adamw"


@pytest.mark.parametrize(
    "name",
    ["adamw", "mars-soap:gamma=0", "adamw:aux_lr=tuned,eps=1e-10", "mars-adamw:mode=exact",
     "mars-adamw:gamma=0.025,betas=[0.95,0.99],weight_decay_1d=0.0",
     "adamw:eps=1e-10,aux_lr=tuned"],
)  # fmt: skip
def test_the_name_round_trips_in_the_order_written(name):
    """The name is the cell's identity (its directory, its ledger rows): never reordered."""
    v = Variant.parse(name)
    assert v.name == name and Variant.parse(v.name) == v


def test_the_old_functions_are_thin_calls_of_the_type():
    assert split_variant("mars-soap:gamma=0,clip=none") == (
        "mars-soap", ["optimizer.gamma=0", "optimizer.clip=none"])  # fmt: skip
    assert variant_tuned("adamw:aux_lr=tuned") == ["aux_lr"]
    assert dir_name("mars-soap:gamma=0") == "mars-soap@gamma-0"


BAD = [
    ("mars-soap:", "NAME:KEY=VALUE"),
    ("mars-soap:gamma", "'gamma' is not KEY=VALUE"),
    ("mars-soap:=1", "'=1' is not KEY=VALUE"),
    ("mars-soap:gamma=", "'gamma=' is not KEY=VALUE"),
    (":gamma=0", "NAME:KEY=VALUE"),
    ("mars-adamw:betas=[0.9,0.95", "is not KEY=VALUE"),
    ("mars-soap:gamma=0,,clip=none", "'' is not KEY=VALUE"),
    ("mars-soap:gamma=0,gamma=1", "gamma is given twice"),
    ("mars-soap: gamma=0", "' gamma=0' is not KEY=VALUE"),
    ("adamw:batch_tokens=tuned", "batch_tokens=tuned: a positive whole number"),
    ("adamw:batch_tokens=-8", "batch_tokens=-8: a positive whole number"),
]


@pytest.mark.parametrize(("name", "line"), BAD)
def test_a_bad_spelling_is_refused_in_one_line_with_the_spelling_to_use(name, line):
    with pytest.raises(ValueError) as exc:
        Variant.parse(name)
    text = str(exc.value)
    assert line in text and "\n" not in text and text.startswith(f"optimizer {name!r}: ")
    assert "e.g." in text  # the fix, spelled out


def _ledger_rows():
    for path in sorted((ROOT / "results").rglob("results.csv")):
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                yield path, row


def test_every_name_in_the_committed_ledgers_round_trips_to_its_directory():
    """Known answers: every optimizer a committed results.csv names parses, gives back its
    name, and its directory is the one its runs live in (a run_dir of its own study)."""
    seen = 0
    for path, row in _ledger_rows():
        name = row["optimizer"]
        v = Variant.parse(name)
        assert v.name == name, path
        run_dir = row.get("run_dir", "").rpartition(":")[2]  # a merged row: FILE:run_dir
        if run_dir.startswith("runs/"):
            assert run_dir.split("/")[3] == v.dir_name, (path, run_dir)
            seen += 1
    assert seen > 1000


ADAMW_LIKE = "mars-adamw:gamma=0,betas=[0.9,0.95],weight_decay=0.3162,warmup_steps=386"


def _overrides(tmp_path, name, values, extra=()):
    from study.plan import Cell, Plan
    from study.state import Study

    plan = Plan(out=tmp_path, optimizers=[name], models=["proxy-100k"], budgets=[1],
                baseline_budgets=[], knobs=["lr"], extra=list(extra))  # fmt: skip
    return Study(plan).overrides(Cell(name, "proxy-100k", 1), values, 0)


def test_a_variants_warmup_reaches_the_run_and_is_neither_tuned_nor_carried(tmp_path):
    """``warmup_steps=N`` is a run setting: schedule.warmup_steps=N on the command line, once;
    the carried warmup knob (a fraction of the steps) does not replace it."""
    v = Variant.parse(ADAMW_LIKE)
    assert v.run == (("warmup_steps", "386"),)
    assert "schedule.warmup_steps=386" in v.overrides
    assert {"schedule.warmup_steps", "optimizer.weight_decay", "optimizer.betas"} <= v.override_keys
    args = _overrides(tmp_path, ADAMW_LIKE, {"lr": 0.008, "warmup": 0.05, "wd": 1e-5,
                                             "beta2": 0.99, "aux_lr": 0.512})  # fmt: skip
    last = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in args}  # Hydra keeps the last
    assert last["schedule.warmup_steps"] == "386"
    assert last["optimizer.weight_decay"] == "0.3162" and last["optimizer.betas"] == "[0.9,0.95]"
    assert last["optimizer.aux_lr"] == "0.512" and last["optimizer.gamma"] == "0"
    assert sum(a.startswith("schedule.warmup_steps=") for a in args) == 1
    plain = _overrides(tmp_path, "mars-adamw:gamma=0", {"lr": 0.008, "warmup": 0.05})
    assert "schedule.warmup_steps=48" in plain  # the carried fraction of 966 steps


def test_a_study_override_that_would_replace_a_variants_value_is_refused(tmp_path):
    with pytest.raises(ValueError, match="schedule.warmup_steps=10 .*replace the variant's"):
        _overrides(tmp_path, ADAMW_LIKE, {"lr": 0.008}, extra=["schedule.warmup_steps=10"])
    assert _overrides(tmp_path, ADAMW_LIKE, {"lr": 0.008}, extra=["schedule.warmup_steps=386"])
