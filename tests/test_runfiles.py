"""runtime/runfiles.py: the one door to a run directory's files (written by the trainer, read by
the study, the report and the launchers)."""

import json

from runtime import runfiles


def test_written_files_read_back(tmp_path):
    runfiles.write_config(tmp_path, {"max_steps": 10, "optimizer": {"lr": 0.003}})
    runfiles.append_meta(tmp_path, {"host": "a"})
    runfiles.append_meta(tmp_path, {"host": "b"})
    runfiles.write_summary(tmp_path, {"steps": 10, "final_val_loss": 2.5})
    assert runfiles.read_config(tmp_path) == {"max_steps": 10, "optimizer": {"lr": 0.003}}
    assert [m["host"] for m in runfiles.read_meta(tmp_path)] == ["a", "b"]
    assert runfiles.read_summary(tmp_path)["final_val_loss"] == 2.5
    assert not runfiles.is_run_dir(tmp_path)  # no metrics yet
    (tmp_path / runfiles.METRICS).write_text('{"step": 1}\n')
    assert runfiles.is_run_dir(tmp_path)


def test_a_line_that_adds_to_a_session_is_merged_into_it(tmp_path):
    """The routes known after a session's first step (``add_to_session``) are part of that
    session's record: one record per session, as before."""
    runfiles.append_meta(tmp_path, {"host": "a"})
    runfiles.add_to_session(tmp_path, {"optimizer_routes": {"loop": {"buckets": 2}}})
    runfiles.append_meta(tmp_path, {"host": "b"})
    assert runfiles.read_meta(tmp_path) == [
        {"host": "a", "optimizer_routes": {"loop": {"buckets": 2}}},
        {"host": "b"},
    ]


def test_finished_needs_a_summary_with_the_steps(tmp_path):
    assert runfiles.finished(tmp_path / "missing") is None
    runfiles.write_config(tmp_path, {"max_steps": 10})
    assert runfiles.finished(tmp_path) is None  # no summary: not finished
    runfiles.write_summary(tmp_path, {"steps": 5})
    assert runfiles.finished(tmp_path) is None  # the config asks for 10
    assert runfiles.finished(tmp_path, max_steps=5) == {"steps": 5}
    runfiles.write_summary(tmp_path, {"steps": 10})
    assert runfiles.finished(tmp_path) == {"steps": 10}
    assert runfiles.finished(tmp_path, max_steps=20) is None  # a longer run asked
    assert runfiles.reached({"steps": 3}, None) and not runfiles.reached({}, None)


def test_readers_are_tolerant(tmp_path):
    (tmp_path / runfiles.SUMMARY).write_text("{not json")
    (tmp_path / runfiles.CONFIG).write_text("- a list\n")
    lines = [json.dumps({"step": 1}), "cut short", json.dumps({"step": 2}), '{"step": 3']
    (tmp_path / runfiles.METRICS).write_text("\n".join(lines) + "\n")
    warnings = []
    assert runfiles.read_summary(tmp_path, warnings) is None and "unreadable" in warnings[0]
    assert runfiles.read_config(tmp_path) is None  # not a mapping
    assert runfiles.finished(tmp_path, 1) is None
    warnings = []
    assert [r["step"] for r in runfiles.read_metrics(tmp_path, warnings)] == [1, 2]
    assert warnings == [f"{tmp_path / runfiles.METRICS}: line 2 is not JSON; skipped"]
    assert runfiles.read_meta(tmp_path) == []
