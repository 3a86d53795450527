"""The conformance kit (optim/conformance/, docs/conformance.md): this project's optimizers follow
the official trajectories with their default (official) options, and the kit catches wrong ports.
The vectors were produced by running the official code; it is not needed here."""

import json

import pytest
import torch

import optim
from optim.conformance import check, for_class, make_dropin, manifest, run_vector, select
from optim.conformance.__main__ import main
from optim.conformance.examples import make_functional, make_timm_style
from optim.conformance.mutants import MUTANTS, PlainMARS

ENTRIES = manifest()["vectors"]
CLASSES = {"MARS": optim.MARS, "MARS_M": optim.MARS_M, "MARS_M_Efficient": optim.MARS_M_Efficient,
           "Moonlight": optim.Moonlight, "Muon": optim.Muon}  # fmt: skip


def test_manifest_records_the_official_run():
    m = manifest()
    assert m["official"]["commit"].startswith("4831e28")
    names = {e["name"] for e in ENTRIES}
    assert names == {f"mars-{t}-{mode}" for t in ("adamw", "lion", "shampoo")
                     for mode in ("approx", "exact")} | {"mars-m-approx", "mars-m-exact",
                     "mars-m-efficient", "moonlight", "muon"}  # fmt: skip
    for e in ENTRIES:
        assert e["steps"] >= 10 and e["dtype"] == "float64" and e["tolerance"]
        for steps in e.get("clipped_steps", {}).values():  # the clip fires on some steps only
            assert 0 < len(steps) < e["steps"]


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e["name"])
def test_this_project_matches_every_vector(entry):
    result = run_vector(make_dropin(CLASSES[entry["official_class"]]), entry)
    assert result.passed, result


def test_the_vectors_change_the_weights_and_lr_warms_up():
    from optim.conformance.runner import load

    vec = load(select(["mars-adamw-approx"])[0])
    lrs = vec["lrs"]["wte.weight"]
    assert lrs[0] == 0 and lrs[1] < lrs[2] < lrs[3]  # warm-up from 0, as the official scripts
    moved = vec["params"]["h.0.mlp.c_fc.weight"][-1] - vec["init"]["h.0.mlp.c_fc.weight"]
    assert moved.abs().max() > 1e-3


def test_a_plain_port_and_the_adapter_examples_pass():
    adamw = select(["mars-adamw-*"])
    assert all(r.passed for r in check(make_dropin(PlainMARS), adamw))
    assert all(r.passed for r in check(make_functional, adamw))


class TimmStyle(optim.MARS):
    """A stand-in with timm's keyword names over this project's MARS."""

    def __init__(self, params, *, lr, betas, gamma, mars_type, optimize_1d, lr_1d_factor,
                 betas_1d, caution):  # fmt: skip
        assert not caution
        super().__init__(params, lr=lr, betas=betas, gamma=gamma, mars_type=f"mars-{mars_type}",
                         optimize_1d=optimize_1d, lr_1d=lr * lr_1d_factor, betas_1d=betas_1d)  # fmt: skip


def test_timm_style_adapter_maps_the_keywords():
    make = make_timm_style(TimmStyle)
    assert all(r.passed for r in check(make, select(make.vectors)))


def expected_first_step(mutant: str, entry: dict) -> int:
    """Where each mutant must first leave tolerance. lr is 0 at step 1 (official warm-up), so a
    wrong step-1 state first shows in the weights at step 2."""
    if mutant == "clip-before-correction":  # wrong exactly where the official clip fires
        return max(2, min(min(s) for s in entry["clipped_steps"].values()))
    return 2  # the reference (alias) or the correction's size: wrong from the first correction


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_the_kit_catches_each_mutant_at_the_expected_step(mutant):
    for entry in select(["mars-adamw-*"]):
        result = run_vector(make_dropin(MUTANTS[mutant]), entry)
        if mutant == "aliased-reference" and entry["mode"] == "exact":
            assert result.passed  # exact mode never keeps p.grad: the alias does no harm there
            continue
        assert not result.passed and result.failure[0] == expected_first_step(mutant, entry)
        assert result.failure[2] > 1e-6  # far outside the 1e-10 tolerance


def test_alias_is_only_caught_when_grad_buffers_are_reused():
    entry = select(["mars-adamw-approx"])[0]
    alias = make_dropin(MUTANTS["aliased-reference"])
    assert run_vector(alias, entry, set_to_none=True).passed  # the official scripts' zero_grad
    assert not run_vector(alias, entry).passed


def test_bf16_vectors_still_catch_wrong_rules():
    """Newton-Schulz in bf16 blurs the weights; the update tolerance still separates a wrong
    clip or correction from bf16 rounding."""
    for name, kwargs in [("mars-m-approx", {"clip_c": False}),
                         ("mars-m-approx", {"gamma": 0.025 * 0.05 / 0.95}),
                         ("mars-shampoo-approx", {"first_step": "plain"})]:  # fmt: skip
        entry = select([name])[0]
        cls = CLASSES[entry["official_class"]]
        wrong = {**entry, "kwargs": {**entry["kwargs"], **kwargs}}
        assert not run_vector(make_dropin(cls), wrong).passed, (name, kwargs)


def test_command_line(capsys):
    assert main(["optim:MARS_M"]) == 0
    out = capsys.readouterr().out
    assert "mars-m-approx        PASS" in out and "2/2 vectors pass" in out
    assert main(["optim.conformance.mutants:UnscaledCorrection", "--vectors",
                 "mars-adamw-approx"]) == 1  # fmt: skip
    assert "FAIL at step 2 of 12" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="MODULE:NAME"):
        main(["optim.MARS"])
    with pytest.raises(SystemExit, match="no vector matches"):
        main(["optim:MARS", "--vectors", "nope"])


def test_vectors_are_small_and_load_without_pickle():
    from optim.conformance.runner import VECTORS

    total = sum(p.stat().st_size for p in VECTORS.iterdir())
    assert total < 3 * 2**20
    for entry in ENTRIES:
        vec = torch.load(VECTORS / entry["file"], weights_only=True)
        assert vec["params"]["wte.weight"].dtype == torch.float64
    json.loads((VECTORS / "manifest.json").read_text())
    assert for_class("MARS") and not for_class("NoSuchClass")
