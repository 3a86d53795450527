"""Divergence is a state (trainer/nonfinite.py, trainer/run.py): the count of non-finite steps in
a row and the reason a run stopped are in its checkpoints and summary.json; a diverged run is
never finished, and running it again is refused in one line unless asked to go on."""

from __future__ import annotations

import json
import math

import pytest
import torch
from test_nonfinite import inject, run  # noqa: F401  (inject: a fixture)

from runtime import runfiles
from study.state import finished_loss

COMMON = ("eval_every=0", "nonfinite.max_consecutive=2", "ckpt_every=2", "keep_checkpoints=2")


def snapshot(d):
    return {p: p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_a_diverged_run_is_recorded_and_refused_when_run_again(tmp_path, sotu_dir, inject):  # noqa: F811
    inject({s: "nan" for s in range(5, 20)})
    with pytest.raises(SystemExit) as info:
        run(tmp_path, sotu_dir, "max_steps=10", *COMMON)
    assert "stopping at step 6: non-finite gradient norm" in str(info.value)
    assert "those of step 4" in str(info.value)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stopped"] == "diverged" and summary["steps"] == 6
    assert summary["final_val_loss"] is None and summary["nonfinite_in_a_row"] == 2
    assert summary["stop_reason"] == str(info.value)
    assert not runfiles.reached(summary, 10)  # never finished ...
    assert runfiles.finished(tmp_path, 10) == summary  # ... but over: the study moves on
    assert math.isinf(finished_loss(tmp_path, 10))  # counted as diverged there
    names = [p.name for p in (tmp_path / "checkpoints").glob("step_*.pt")]
    assert sorted(names) == ["step_0000002.pt", "step_0000004.pt", "step_0000006.pt"]  # none pruned
    c = torch.load(tmp_path / "checkpoints" / "step_0000006.pt", weights_only=True)
    assert (c["stopped"], c["nonfinite_in_a_row"], c["step"]) == ("diverged", 2, 6)

    before = snapshot(tmp_path)
    with pytest.raises(SystemExit) as again:  # the same command: one line, nothing touched
        run(tmp_path, sotu_dir, "max_steps=10", *COMMON)
    message = str(again.value)
    assert "\n" not in message
    assert message == (
        f"{tmp_path} stopped at step 6: it diverged (2 non-finite steps in a row), and the same "
        "command would stop the same way. Change what diverged: a lower optimizer.lr (a new run), "
        f"or resume={tmp_path / 'checkpoints' / 'step_0000004.pt'} (an earlier checkpoint); to go "
        "on from step 6 anyway: nonfinite.resume_diverged=true"
    )
    assert snapshot(tmp_path) == before

    inject({})  # asked to go on, and the data is fine now
    summary = run(tmp_path, sotu_dir, "max_steps=10", *COMMON, "nonfinite.resume_diverged=true")
    assert summary["stopped"] is None and summary["steps"] == 10
    assert summary["final_val_loss"] is not None and runfiles.reached(summary, 10)


def test_the_count_in_a_row_survives_a_restart(tmp_path, sotu_dir, inject):  # noqa: F811
    """A run whose budget ends on non-finite steps is not finished (issue 66): it ends as
    diverged with its count in a row in its checkpoint, and a longer run from it is refused
    with that count (kept, not reset by the restart)."""
    inject({3: "nan", 4: "nan", 5: "nan"})
    common = ("eval_every=0", "nonfinite.max_consecutive=3")
    with pytest.raises(SystemExit, match=r"did not finish: its last 2 step\(s\) to step 4 were"):
        run(tmp_path, sotu_dir, "max_steps=4", *common)  # ends on 2 in a row
    first = json.loads((tmp_path / "summary.json").read_text())
    assert first["nonfinite_in_a_row"] == 2 and first["stopped"] == "diverged"
    assert not runfiles.reached(first, 4) and math.isinf(finished_loss(tmp_path, 4))
    c = torch.load(tmp_path / "checkpoints" / "step_0000004.pt", weights_only=True)
    assert c["nonfinite_in_a_row"] == 2
    with pytest.raises(SystemExit, match=r"stopped at step 4: it diverged \(2 non-finite steps"):
        run(tmp_path, sotu_dir, "max_steps=8", *common)  # a longer run: the count is kept
