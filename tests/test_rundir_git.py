"""A run records its code: the commit, and in git.diff the uncommitted changes and the untracked
files git does not ignore, so ``git apply git.diff`` on the commit gives the code that ran."""

import subprocess

import pytest

from trainer.rundir import git_info


def git(cwd, *args):
    return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd,
                          check=True, capture_output=True, text=True).stdout  # fmt: skip


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    (root / ".gitignore").write_text("runs/\n")
    (root / "core.py").write_text("a = 1\n")
    git(root, "add", "."), git(root, "commit", "-qm", "first")
    return root


def test_untracked_source_files_are_recorded_and_the_diff_restores_them(repo, tmp_path):
    (repo / "core.py").write_text("a = 2\n")
    (repo / "optim").mkdir()
    (repo / "optim" / "variant.py").write_text("class Variant:\n    pass\n")
    (repo / "runs").mkdir()
    (repo / "runs" / "ignored.txt").write_text("not code\n")
    info = git_info(repo)
    assert info["dirty"] and info["reproducible"]
    assert info["untracked"] == ["optim/variant.py"] and info["untracked_skipped"] == []
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(repo), str(clone))
    (tmp_path / "git.diff").write_text(info["diff"])
    git(clone, "apply", str(tmp_path / "git.diff"))
    assert (clone / "optim" / "variant.py").read_text() == "class Variant:\n    pass\n"
    assert (clone / "core.py").read_text() == "a = 2\n"


def test_a_big_or_binary_untracked_file_makes_the_run_not_reproducible(repo):
    (repo / "weights.bin").write_bytes(b"\0\1\2" * 10)
    info = git_info(repo)
    assert info["untracked_skipped"] == ["weights.bin"] and not info["reproducible"]
    assert info["dirty"]


def test_a_clean_checkout_is_reproducible_with_an_empty_diff(repo):
    info = git_info(repo)
    assert info["reproducible"] and not info["dirty"] and info["diff"] == ""


def test_a_studys_published_results_are_not_code(repo):
    """results/ holds a study's published ledgers: changing them neither dirties the runs'
    code (git_info) nor stops the study's next part (study.cli.dirty_files)."""
    from study.cli import dirty_files

    (repo / "results" / "part").mkdir(parents=True)
    (repo / "results" / "part" / "results.csv").write_text("a\n1\n")
    git(repo, "add", "."), git(repo, "commit", "-qm", "ledger")
    (repo / "results" / "part" / "results.csv").write_text("a\n1\n2\n")
    (repo / "results" / "part" / "report.md").write_text("# new\n")
    info = git_info(repo)
    assert not info["dirty"] and info["diff"] == "" and info["untracked"] == []
    assert dirty_files(repo) == []
    (repo / "core.py").write_text("a = 3\n")
    assert git_info(repo)["dirty"] and dirty_files(repo) == ["core.py"]


def test_each_session_keeps_its_own_diff_and_a_fresh_start_drops_the_abandoned_ones(
    tmp_path, monkeypatch
):
    """A resumed session's uncommitted code goes to git.N.diff beside the start's git.diff (it used
    to replace it), its meta line names it, and the ledger reads each session's own; a start from
    step 0 on a clean tree removes an abandoned session's diffs (none is read as its code)."""
    from runtime import runfiles
    from study.results import _commit, _resumed
    from trainer import rundir

    code = "diff --git a/optim/core.py b/optim/core.py\n--- a/optim/core.py\n+y\n"
    log = "diff --git a/ladder.log b/ladder.log\nnew file mode 100644\n+x\n"

    def session(commit, diff, untracked=(), resume=None):  # noqa: ANN001, ANN202
        info = {"commit": commit, "dirty": bool(diff), "diff": diff, "untracked": list(untracked),
                "untracked_skipped": [], "reproducible": True}  # fmt: skip
        monkeypatch.setattr(rundir, "git_info", lambda: info)
        rundir.write_run_files(tmp_path, {"seed": 1}, {"resume_from": resume, "gpu": None})

    ckpt = str(tmp_path / "checkpoints" / "step_0000300.pt")
    session("aaaa11112222ffff", code)
    session("bbbb33334444ffff", log, ["ladder.log"], resume=ckpt)
    session("cccc55556666ffff", "", resume=ckpt.replace("300", "600"))
    assert (tmp_path / "git.diff").read_text() == code
    assert (tmp_path / "git.2.diff").read_text() == log
    assert [m["git_diff"] for m in runfiles.read_meta(tmp_path)] == ["git.diff", "git.2.diff", None]
    assert _commit(tmp_path) == "aaaa11112222+dirty"
    assert _resumed(tmp_path) == "300@bbbb33334444+untracked(ladder.log); 600@cccc55556666"
    session("dddd77778888ffff", "")  # the run starts over from step 0, clean
    assert not (tmp_path / "git.diff").exists() and not list(tmp_path.glob("git.*.diff"))
    assert _commit(tmp_path) == "dddd77778888" and _resumed(tmp_path) == ""
    session("eeee9999aaaaffff", code, resume=ckpt)
    assert (tmp_path / "git.2.diff").read_text() == code  # numbered from the last start
    assert _resumed(tmp_path) == "300@eeee9999aaaa+dirty"
