"""The correction on AdamW's own configuration (study/studies/crossover.yaml, corr-* and chain-*
parts; docs/study.md): MARS-AdamW with every value AdamW's and gamma = 0 *is* AdamW, on a model
with every kind of parameter (tied embedding, positions, gains, matrices), in float64, so the arm
with gamma > 0 minus AdamW's rows is the correction alone; and the arms' names carry exactly the
values the issue names."""

import pytest
import torch

from model import ModelConfig, build_model
from optim import build_optimizer, get_spec
from study.variant import Variant

# AdamW's carried values at the crossover (results/referee/batch, proxy-100k 1x): the arm's.
ADAMW_VALUES = {"betas": [0.9, 0.95], "weight_decay": 0.3162, "aux_lr": 0.512}


def _model():
    torch.manual_seed(0)
    cfg = ModelConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=16)
    return build_model(cfg).double()


def _train(opt_name, steps=25, **values):
    model = _model()
    cfg = get_spec(opt_name).config_cls(lr=0.008, **values)
    opt = build_optimizer(model, cfg)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randint(0, 64, (4, 16), generator=gen)
        loss = model(x, x)[1]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the trainer's global clip
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def test_mars_adamw_at_gamma_zero_with_adamws_values_is_adamw_on_a_model():
    ours = _train("mars-adamw", gamma=0.0, weight_decay_1d=0.0, **ADAMW_VALUES)
    theirs = _train("adamw", **ADAMW_VALUES)
    worst = max(float((a - b).abs().max()) for a, b in zip(ours, theirs))
    assert worst < 1e-12, worst
    corrected = _train("mars-adamw", gamma=0.0528, weight_decay_1d=0.0, **ADAMW_VALUES)
    assert max(float((a - b).abs().max()) for a, b in zip(corrected, theirs)) > 1e-4


def test_the_gains_decay_is_the_one_value_between_a0_and_a1():
    a1 = _train("mars-adamw", gamma=0.0, **ADAMW_VALUES)  # weight_decay_1d: its default 0.1
    theirs = _train("adamw", **ADAMW_VALUES)
    assert max(float((a - b).abs().max()) for a, b in zip(a1, theirs)) > 1e-6


def test_the_correction_arm_fixes_every_value_adamw_differs_in():
    from study import definition as defs

    parts = defs.load("crossover").parts
    names = {p: parts[p].values["optimizers"] for p in ("corr-b2048", "corr-b8192", "corr-b32768")}
    assert len({n for v in names.values() for n in v}) == 1  # one arm at every batch
    corr = Variant.parse(names["corr-b2048"][0])
    fixed = dict(corr.fixed)
    assert fixed["gamma"] == "0.0528" and fixed["betas"] == "[0.9,0.95]"
    assert fixed["weight_decay"] == "0.3162" and fixed["weight_decay_1d"] == "0"
    assert dict(corr.run) == {"warmup_steps": "386"}
    # kappa = gamma beta1 / (1 - beta1): the paper's 0.475 (gamma 0.025 at beta1 0.95)
    assert abs(0.0528 * 0.9 / 0.1 - 0.025 * 0.95 / 0.05) < 1e-3


def test_the_chain_switches_one_value_a_step():
    """A1 -> A2 drops the warmup (to the carried 48), A2 -> A3 the matrix weight decay (to the
    carried 1e-5); A1 is the correction arm at gamma = 0 less ``weight_decay_1d=0``."""
    from study import definition as defs

    parts = defs.load("crossover").parts
    a1, a2, a3, smg = (
        dict(Variant.parse(o).options) for o in parts["chain-b2048"].values["optimizers"]
    )
    corr = dict(Variant.parse(parts["corr-b2048"].values["optimizers"][0]).options)
    assert {k: v for k, v in corr.items() if k not in ("gamma", "weight_decay_1d")} == {
        k: v for k, v in a1.items() if k != "gamma"} and a1["gamma"] == "0"  # fmt: skip
    assert {k: v for k, v in a1.items() if k != "warmup_steps"} == a2
    assert {k: v for k, v in a2.items() if k != "weight_decay"} == a3
    assert a3 == {"gamma": "0", "betas": "[0.9,0.95]"} and smg == {"second_moment": "g"}


def _rows(arms, **where):
    return [{"optimizer": a, "model": "proxy-100k", "budget": 1, "seed": s, "role": "eval",
             "chosen": 1, "lr": 0.008, "final_val_loss": v, "run_dir": f"runs/{a}/seed-{s}",
             **where}
            for a, seeds in arms.items() for s, v in seeds.items()]  # fmt: skip


def test_the_anatomy_steps_are_the_paired_differences_of_their_ledgers(tmp_path):
    from study import definition as defs
    from study.findings import correction
    from study.results import write_csv

    parts = defs.load("crossover").parts
    corr = parts["corr-b2048"].values["optimizers"][0]
    a1, a2, a3, smg = parts["chain-b2048"].values["optimizers"]
    base = {s: 1.5 + 0.01 * s for s in range(1, 6)}
    shift = lambda d, x: {s: v + x + 0.001 * s * s for s, v in d.items()}  # noqa: E731
    ledgers = {
        "b2048": {"adamw": base, "mars-adamw:gamma=0": shift(base, 0.15),
                  "mars-adamw": shift(base, 0.10)},
        "corr-b2048": {corr: shift(base, -0.02)},
        "chain-b2048": {a1: shift(base, 0.01), a2: shift(base, 0.05), a3: shift(base, 0.06),
                        smg: shift(base, 0.30)},
    }  # fmt: skip
    for part, arms in ledgers.items():
        (tmp_path / part).mkdir()
        write_csv(_rows(arms, cpu="AMD EPYC"), tmp_path / part / "results.csv")
    rows = {r["step"].label: r for r in correction.measure(tmp_path)}
    got = rows["2,048 B: AdamW + correction - AdamW"]
    assert got["n"] == 5 and abs(got["mean"] - (-0.02 + 0.011)) < 1e-12  # 0.001 s^2, s = 1..5
    assert abs(rows["A2: + warmup 48 steps (AdamW's 386)"]["mean"] - 0.04) < 1e-12
    assert abs(rows["A4: + beta1 0.95 (AdamW's 0.9) = the gamma = 0 arm"]["mean"] - 0.09) < 1e-12
    assert rows["8,192 B: AdamW + correction - AdamW"]["n"] == 0  # no ledger: running
    tests = correction.family_tests(tmp_path)
    assert not any("Delta_gamma" in t["test"] for t in tests)  # the crossover's already
    assert len(tests) == 6  # Delta_corr at 2 KB, A1-A4, second moment from g
    text = correction.write(tmp_path).read_text()
    assert "| 8,192 B: AdamW + correction - AdamW | running (0 of 5 pairs) |" in text


def test_a_cell_that_ran_bf16_is_not_measured_and_adds_no_test(tmp_path):
    from study.findings import crossover_report as cr
    from study.findings.family import crossover_losses
    from study.results import write_csv

    arms = {a: {s: 1.2 + i / 10 + s / 1000 for s in range(1, 6)} for i, a in enumerate(cr.ARMS)}
    for b, where in ((131072, {"device": "NVIDIA H100 80GB HBM3"}), (32768, {"cpu": "AMD EPYC"})):
        (tmp_path / f"b{b}").mkdir()
        write_csv(_rows(arms, **where), tmp_path / f"b{b}" / "results.csv")
    assert cr.void_cells(tmp_path, [131072, 32768]) == {cr.Cell("proxy-100k", 131072): "bfloat16"}
    text = cr.write(tmp_path, [32768, 131072]).read_text()
    assert "| every comparison | 131,072 | not measured yet (bfloat16 arithmetic" in text
    assert (
        "| MARS-AdamW - AdamW | 131,072 |" not in text and "| MARS-AdamW - AdamW | 32,768 |" in text
    )
    assert list(crossover_losses(tmp_path)) == ["crossover b32768"]


def test_the_epochs_column_on_a_fixture_corpus(tmp_path):
    """Two shards of 1,000 and 129 tokens hold (999 // 64) + (128 // 64) = 17 windows of 64
    tokens: 1,088 tokens an epoch; 966 steps of 2,048 tokens are 966 * 2048 / 1088 epochs."""
    import json

    import numpy as np

    from data.config import DataConfig
    from data.shards import write_shard
    from study.findings import crossover_report as cr
    from study.findings.crossover import corpus_record

    d = tmp_path / "shards"
    d.mkdir()
    write_shard(d / "c_train_000000.bin", np.arange(1000) % 257, tokenizer_id=1)
    write_shard(d / "c_train_000001.bin", np.arange(129) % 257, tokenizer_id=1)
    write_shard(d / "c_val_000000.bin", np.arange(100) % 257, tokenizer_id=1)
    rec = corpus_record(cfg=DataConfig(name="c", dir=str(d), tokenizer="bytes"))
    assert (rec["train_tokens"], rec["epoch_tokens"], rec["seq_len"]) == (1129, 1088, 64)
    (tmp_path / "corpus.json").write_text(json.dumps(rec))
    got = cr.epochs_of(tmp_path, [2048, cr.Cell("proxy-100k", 8192)])
    assert got[2048] == 966 * 2048 / 1088 and got[cr.Cell("proxy-100k", 8192)] == 966 * 8192 / 1088


def test_the_readmes_correction_sentences_are_generated_from_the_ledgers():
    from helpers import ROOT
    from study.findings import correction

    readme = (ROOT / "README.md").read_text()
    block = correction.README_MARK.search(readme)
    assert block, "README.md lacks its '<!-- correction: ... -->' block"
    want = correction.readme_block(ROOT / "results" / "crossover")
    assert block[2] == want, "run: python -m study correction --readme README.md"


def test_the_docs_conclusions_are_the_familys():
    from helpers import ROOT
    from study.findings import family

    page = (ROOT / "docs" / "study.md").read_text()
    block = family.DOCS_MARK.search(page)
    assert block, "docs/study.md lacks its '<!-- conclusions: ... -->' block"
    tests = family.family(ROOT / "results" / "referee", ROOT / "results" / "crossover")
    assert block[2] == family.conclusions(tests), "run: python -m study family --docs docs/study.md"


def test_a_prediction_is_scored_against_the_measured_sign():
    """Crossover predicted at 8,192: helps from there. Measured: helps at 2,048 (interval below
    0), nothing at 8,192, hurts at 32,768: three misses, and a record at its last phase only."""
    from study.findings import prediction_score

    preds = [{"file": "p.json", "label": "mars-adamw", "step": s, "steps": 966, "crossover": c}
             for s, c in ((483, float("inf")), (966, 8192.0))]  # fmt: skip
    name = "Delta_gamma: MARS-AdamW - (gamma = 0)"
    measured = [{"comparison": name, "batch": b, "lo": lo, "hi": hi}
                for b, lo, hi in ((2048, -0.07, -0.02), (8192, -0.08, 0.06), (32768, 0.01, 0.03),
                                  (4096, -0.2, -0.1))]  # fmt: skip
    got = prediction_score.scored(preds, measured)
    assert [(r["batch"], r["predicted"], r["measured"], r["hit"]) for r in got] == [
        (2048, "no help", "helps", False), (8192, "helps", "no difference", False),
        (32768, "helps", "hurts", False), (4096, "no help", "helps", False)]  # fmt: skip
    assert {r["step"] for r in got} == {966}
    preds[1]["crossover"] = 2048.0
    assert prediction_score.scored(preds, measured[:1])[0]["hit"]


def test_the_docs_anatomy_reading_is_the_ledgers():
    from helpers import ROOT
    from study.findings import family

    page = (ROOT / "docs" / "study.md").read_text()
    block = family.ANATOMY_MARK.search(page)
    assert block, "docs/study.md lacks its '<!-- anatomy: ... -->' block"
    tests = family.family(ROOT / "results" / "referee", ROOT / "results" / "crossover")
    want = family.anatomy(ROOT / "results" / "crossover", tests)
    assert block[2] == want, "run: python -m study family --docs docs/study.md"


def test_the_repetition_control_flags_a_pair_that_moves(tmp_path):
    """Planted ledgers: each gap is exact plus the same per-seed noise (sd 0.0158, a 90%
    half-width of 0.015). On a quarter of the data MARS-AdamW's gap moves from +0.10 to +0.11
    (inside the whole cell's interval) and gamma = 0's from +0.10 to +0.30 (outside): only that
    one is flagged, and nothing is said until both ledgers are there."""
    from study.findings import correction
    from study.results import write_csv

    noise = {1: -0.02, 2: 0.01, 3: 0.0, 4: 0.02, 5: -0.01}

    def ledger(part, gaps):
        rows = []
        for opt, gap in (("adamw", None), *gaps.items()):
            for s in range(1, 6):
                loss = 1.3 + s / 100 + (0.0 if gap is None else gap + noise[s])
                rows.append({"optimizer": opt, "model": "proxy-100k", "budget": 4.0, "seed": s,
                             "role": "eval", "chosen": 1.0, "lr": 0.01, "final_val_loss": loss})  # fmt: skip
        (tmp_path / part).mkdir()
        write_csv(rows, tmp_path / part / "results.csv")

    ledger("b8192", {"mars-adamw": 0.10, "mars-adamw:gamma=0": 0.10})
    assert correction.repetition(tmp_path) == []
    ledger("rep-b8192", {"mars-adamw": 0.11, "mars-adamw:gamma=0": 0.30})
    got = {c["pair"]: c for c in correction.repetition(tmp_path)}
    whole = got["mars-adamw - adamw"]["whole"]
    assert whole.mean == pytest.approx(0.10) and whole.hi - whole.mean == pytest.approx(
        0.0151, abs=1e-4
    )
    assert not got["mars-adamw - adamw"]["moved"] and got["mars-adamw:gamma=0 - adamw"]["moved"]
    assert got["mars-adamw:gamma=0 - mars-adamw"]["quarter"].mean == pytest.approx(0.19)
