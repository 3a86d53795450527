"""bench.optim_host: the optimizer's host time with the engine's launches stubbed out, its raw
record (device, versions, command, commit, every round, min/median/max). No timing is asserted."""

import json
import sys

import pytest

pytest.importorskip("triton")

from bench import optim_host  # noqa: E402

pytestmark = pytest.mark.engine


def test_host_benchmark_writes_every_round_and_counts_stubbed_launches(
    tmp_path, monkeypatch, capsys
):
    argv = ["optim_host", "--model", "tiny", "--only", "torch-adamw-fused", "mars-adamw",
            "mars-adamw-unkept", "--rounds", "3", "--steps", "2", "--warmup", "1",
            "--out", str(tmp_path)]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    optim_host.main()
    out = capsys.readouterr().out
    assert out.startswith("device: cpu") and "5 engine launches" in out
    (path,) = tmp_path.glob("*.json")
    rec = json.loads(path.read_text())
    assert rec["device"].startswith("device: cpu") and rec["versions"]["torch"]
    assert rec["command"][-len(argv) + 1 :] == argv[1:] and rec["unit"] == "ms"
    assert set(rec["rounds"]) == {"torch-adamw-fused", "mars-adamw", "mars-adamw-unkept"}
    for name, rounds in rec["rounds"].items():
        s = rec["summary"][name]
        assert len(rounds) == 3 and s["min"] <= s["median"] <= s["max"]
    # 2 groups of 2 + 1, less the empty, + the fold's 2 (its pass merged with MARS's norm pass
    # after the warmup step: optim/engine/clip.py)
    assert rec["launches_per_step"]["mars-adamw"] == 5
    assert rec["launches_per_step"]["mars-adamw-unkept"] == 5


def test_fewer_than_three_rounds_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["optim_host", "--rounds", "2"])
    with pytest.raises(SystemExit, match="at least 3"):
        optim_host.parse_args()
