"""The gains instrument (study/findings/gains.py) and the readings docs/study.md draws from its
record (results/crossover/checks/gains.json): the gains measured as defined on a planted state and
on a short run's checkpoints, the committed table its record's, and the three sentences of "How
to read the chain" true of the record."""

import json

import pytest
import torch

import train
from helpers import ROOT, fast_config
from study.findings import gains

RECORD = ROOT / "results" / "crossover" / "checks" / "gains.json"


def test_gains_of_a_planted_state():
    state = {"h.0.ln_1.weight": torch.full((4,), 2.0), "h.0.ln_2.weight": torch.full((4,), 0.5),
             "ln_f.weight": torch.tensor([1.0, 3.0]), "wte.weight": torch.ones(3, 4),
             "h.0.mlp.c_fc.weight": torch.zeros(2, 4)}  # fmt: skip
    mean, smallest = gains.gains_of(state)
    assert mean == pytest.approx((8 + 2 + 4) / 10) and smallest == pytest.approx(0.5)
    with pytest.raises(SystemExit, match="no LayerNorm gains"):
        gains.gains_of({"wte.weight": torch.ones(3, 4)})


def test_a_runs_checkpoints_give_its_trajectory(tmp_path, sotu_dir):
    typed, plain = fast_config(tmp_path, sotu_dir, "max_steps=4", "ckpt_every=2",
                               "keep_checkpoints=0", "eval_every=0")  # fmt: skip
    train.train(typed, plain)
    entry = gains.trajectory(tmp_path)
    assert [p["step"] for p in entry["gains"]] == [2, 4]
    ckpt = torch.load(tmp_path / "checkpoints" / "step_0000004.pt", weights_only=True)
    assert entry["gains"][-1]["mean"] == pytest.approx(gains.gains_of(ckpt["model"])[0])
    assert "out_dir=" not in entry["command"] and str(tmp_path) not in json.dumps(entry)
    with pytest.raises(SystemExit, match="no checkpoints"):
        gains.trajectory(tmp_path / "nothing")


def test_the_committed_table_is_its_record():
    runs = json.loads(RECORD.read_text())
    assert (RECORD.with_suffix(".md")).read_text().endswith(gains.table(runs))


def test_docs_readings_hold_in_the_record():
    """docs/study.md: with the decay the gains' mean stays below 1 the whole run on every seed;
    AdamW's and the undecayed arm's grow to several (here: at least 3) times their start; the
    decay alone, at the same lr, costs each seed between 0.09 and 0.17 in final loss."""
    runs = {r["run"]: r for r in json.loads(RECORD.read_text())}
    seeds = [1, 2, 3, 4, 5]

    def name(arm: str, seed: int) -> str:
        return arm if seed == 1 else f"{arm}-seed{seed}"

    pairs = [(runs[name("a1", s)], runs[name("a1-no-gains-decay", s)]) for s in seeds]
    for decayed, plain in pairs:
        assert decayed["optimizer"]["weight_decay_1d"] == 0.1
        assert plain["optimizer"]["weight_decay_1d"] == 0.0
        assert plain["optimizer"]["lr"] == decayed["optimizer"]["lr"]
        assert all(p["mean"] < 1 for p in decayed["gains"]), decayed["run"]
        assert 0.09 < decayed["final_val_loss"] - plain["final_val_loss"] < 0.17, decayed["run"]
    for r in [plain for _, plain in pairs] + [runs["a0-adamw"]]:
        assert r["gains"][-1]["mean"] >= 3 * r["gains"][0]["mean"], r["run"]
    assert len(runs) == 11 and not any(r["commit"].endswith("+dirty") for r in runs.values())


def test_a_damaged_checkpoint_or_a_foreign_folder_is_one_line(tmp_path, sotu_dir):
    typed, plain = fast_config(tmp_path, sotu_dir, "max_steps=2", "ckpt_every=2",
                               "keep_checkpoints=0", "eval_every=0")  # fmt: skip
    train.train(typed, plain)
    ckpt = tmp_path / "checkpoints" / "step_0000002.pt"
    data = bytearray(ckpt.read_bytes())
    data[len(data) // 2] ^= 0xFF
    ckpt.write_bytes(bytes(data))
    with pytest.raises(SystemExit) as bad:
        gains.main([str(tmp_path), "--out", str(tmp_path / "out" / "g")])
    assert "\n" not in str(bad.value) and "step_0000002.pt" in str(bad.value)
    assert not (tmp_path / "out").exists()  # nothing written
    foreign = tmp_path / "foreign"
    (foreign / "checkpoints").mkdir(parents=True)
    (foreign / "checkpoints" / "step_0000002.pt").write_bytes(ckpt.read_bytes())
    with pytest.raises(SystemExit, match="no meta.jsonl"):
        gains.trajectory(foreign)
