"""eval.py before and while it runs: how many rows each task scores and about how long that
takes, Ctrl-C keeping the tasks done (written as partial), and its own advice for a checkpoint
it cannot use (evals/estimate.py, eval.py)."""

from __future__ import annotations

import json

import pytest
from test_eval import run_eval, task_dir, tiny_run  # noqa: F401  (fixtures)

import eval as eval_py
from evals.estimate import duration, plan_lines, task_tokens
from evals.tasks import Example
from trainer import checkpoint as ckpt


def test_the_plan_names_rows_time_and_a_limit_that_fits():
    rows = {"val": 8, "hellaswag": 10042}
    tokens = {"val": 8192, "hellaswag": 10042 * 4 * 100}
    per_token = {"val": 1e-2, "hellaswag": 1e-2}
    lines = plan_lines(rows, tokens, per_token, device="AMD EPYC", limit=None)
    assert lines == [
        "val: 8,192 tokens, about 82 s on AMD EPYC",
        "hellaswag: 10,042 rows, about 11.2 h on AMD EPYC",
        "in all about 11.2 h",
        "limit=100 scores the first 100 of each task's 10,042 rows or fewer: about 8 min in all",
    ]
    assert len(plan_lines(rows, tokens, per_token, "cpu", limit=50)) == 3  # asked for: no advice
    assert duration(59) == "59 s" and duration(600) == "10 min" and duration(7200) == "2.0 h"


def test_tokens_are_counted_per_choice_and_capped_at_the_block():
    ex = Example(contexts=["a" * 40] * 2, continuations=[" b" * 2, "c" * 1000], choices=["x", "y"],
                 gold=0)  # fmt: skip
    assert task_tokens([ex], block_size=64) == (2, 12 + 64)


def test_eval_says_what_it_will_do_before_it_starts(tiny_run, task_dir, capsys):  # noqa: F811
    run_eval(f"checkpoint={tiny_run}", "tasks=[val,hellaswag]", f"data_dir={task_dir}")
    out = capsys.readouterr().out
    assert "val: 1,024 tokens, about " in out and "hellaswag: 3 rows, about " in out
    assert out.index("hellaswag: 3 rows") < out.index("val loss ")  # before any task ran


def test_ctrl_c_keeps_the_tasks_done_as_partial(tiny_run, task_dir, tmp_path, monkeypatch, capfd):  # noqa: F811
    real = eval_py.run_task

    def interrupted_in_hellaswag(name, *args):
        if name == "hellaswag":
            raise KeyboardInterrupt
        return real(name, *args)

    monkeypatch.setattr(eval_py, "run_task", interrupted_in_hellaswag)
    out = tmp_path / "r.json"
    with pytest.raises(SystemExit) as info:
        run_eval(f"checkpoint={tiny_run}", "tasks=[val,hellaswag]", f"data_dir={task_dir}",
                 f"out={out}")  # fmt: skip
    assert info.value.code == 130
    saved = json.loads(out.read_text())
    assert saved["partial"] is True and saved["interrupted"] == "hellaswag"
    assert set(saved["results"]) == {"val"} and saved["results"]["val"]["loss"] > 0
    err = capfd.readouterr().err.strip().splitlines()
    assert err[-1] == (f"interrupted (Ctrl-C) during hellaswag: val written to {out} (marked "
                       "partial); run the same command again for the rest (tasks=[hellaswag] "
                       "scores only it, limit=N fewer rows)")  # fmt: skip


def test_a_bad_checkpoint_gets_evals_advice_not_trains(tiny_run, tmp_path):  # noqa: F811
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for name in ("step_0000002.pt", "step_0000004.pt"):
        (run / "checkpoints" / name).write_bytes(ckpt.latest_checkpoint(tiny_run).read_bytes())
    newest = run / "checkpoints" / "step_0000004.pt"
    newest.write_bytes(newest.read_bytes()[:1000])
    with pytest.raises(SystemExit) as info:
        run_eval(f"checkpoint={run}", "tasks=[val]")
    message = str(info.value)
    assert "\n" not in message and "resume=" not in message
    assert message.startswith(f"error: {newest} is not a readable checkpoint: ")
    assert message.endswith(f"; evaluate checkpoint={run / 'checkpoints' / 'step_0000002.pt'} "
                            "(the next older one), a run directory or a Hugging Face directory")  # fmt: skip
