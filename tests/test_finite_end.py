"""A run is finished only if its last state is finite (issue 66): non-finite steps when its
budget runs out, or a final validation loss that is not finite or is far above where it
started, end the run as diverged (summary.json ``stopped: diverged``, rc != 0), never as
finished."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
from test_nonfinite import inject, run  # noqa: F401  (inject: a fixture)

from runtime import runfiles
from study.state import finished_loss
from trainer.nonfinite import final_state_problem


def state(in_a_row: int = 0, last: float | None = 2.0, step: int = 7) -> SimpleNamespace:
    return SimpleNamespace(nonfinite_in_a_row=in_a_row, last_val_loss=last, step=step)


@pytest.mark.parametrize(
    ("st", "first", "want"),
    [
        (state(3), 5.6, "its last 3 step(s) to step 7 were non-finite"),
        (state(last=math.nan), 5.6, "its final validation loss is nan at step 7: not finite"),
        (state(last=math.inf), 5.6, "is inf at step 7: not finite"),
        (state(last=7828.7), 5.6, "its final validation loss 7829 at step 7 is far above"),
        (state(last=2.4), 5.6, None),  # a collapse is finished (the study flags it)
        (state(last=6.0), 5.6, None),  # worse than it started, not far: finished
        (state(last=None), None, None),  # no validation (eval_every=0 and no last one)
    ],
)
def test_which_end_states_are_finished(st, first, want):
    why = final_state_problem(st, first, vocab_size=257)
    assert (why is None) if want is None else (want in why), why


def test_non_finite_steps_at_the_budgets_end_end_as_diverged(tmp_path, sotu_dir, inject):  # noqa: F811
    """The issue's ``optimizer.lr=100 max_steps=7``: three non-finite steps in a row when the
    budget ended (fewer than the 5 that stop a run) once gave ``stopped: null`` and rc 0; now a
    one-line SystemExit and a diverged summary, which the study counts as diverged."""
    inject({5: "nan", 6: "nan", 7: "nan"})
    with pytest.raises(SystemExit) as info:
        run(tmp_path, sotu_dir, "max_steps=7", "eval_every=0")
    text = str(info.value)
    assert (
        "\n" not in text and "did not finish: its last 3 step(s) to step 7 were non-finite" in text
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stopped"] == "diverged" and not runfiles.reached(summary, 7)
    assert summary["nonfinite_in_a_row"] == 3
    assert math.isinf(finished_loss(tmp_path, 7))
