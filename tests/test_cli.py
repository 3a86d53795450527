"""What a new user meets at the command line: every misspelt key, group or option refused with one
line naming the closest real one, before torch is imported; ``--help`` listing the real groups;
and the same command continuing its run after ``kill -9`` or SIGTERM (docs/input-checks.md,
docs/failures.md)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from helpers import FAST, ROOT
from trainer import cli_checks, command_line
from trainer.preemption import REQUEUE_EXIT_CODE

# --- the keys read from source are the dataclasses' ---------------------------------------------


def real_fields(cls: type) -> dict:
    """The fields of a dataclass as cli_checks reads them: nested dataclasses as dicts, ``Any``
    as OPEN, other values as None."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        args = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)]
        if tp is typing.Any:
            out[f.name] = cli_checks.OPEN
        elif dataclasses.is_dataclass(tp) or len(args) == 1:
            out[f.name] = real_fields(tp if dataclasses.is_dataclass(tp) else args[0])
        else:
            out[f.name] = None
    return out


def test_keys_read_from_source_equal_the_dataclasses():
    import optim
    from evals.config import EvalConfig
    from trainer.config import TrainConfig

    assert cli_checks.fields("trainer.config", "TrainConfig") == real_fields(TrainConfig)
    assert cli_checks.fields("evals.config", "EvalConfig") == real_fields(EvalConfig)
    found = cli_checks.optimizer_fields()
    assert sorted(found) == sorted(optim.available())
    for name, schema in found.items():
        assert schema == real_fields(optim.get_spec(name).config_cls), name


# --- misspelt names: one line, the closest real name ---------------------------------------------


def refused(*args: str) -> str:
    with pytest.raises(SystemExit) as info:
        command_line.check_command_line(list(args))
    message = str(info.value.code)
    assert message.startswith("config error: ") and "\n" not in message, message
    return message


@pytest.mark.parametrize(
    "args,expected",
    [
        (["max_step=10"], "unknown config key max_step (did you mean max_steps?)"),
        (["+max_step=10"], "unknown config key max_step (did you mean max_steps?)"),
        (["++max_step=10"], "max_step (did you mean max_steps?)"),
        (["optimzer.lr=1e-3"], "optimzer.lr (did you mean optimizer.lr?)"),
        (["optimizer.lrr=1e-3"], "optimizer.lrr (did you mean optimizer.lr?)"),
        (["optimizer=mars-adamw", "optimizer.gama=0.1"], "optimizer.gama (did you mean optimizer.gamma?)"),
        (["optimizer.gamma=0.1"], "optimizer=adamw has no such key; mars-adamw"),
        (["experiment=owt/small-adamw", "optimizer.gamma=0.1"], "optimizer=adamw has no such key"),
        (["model.n_layers=2"], "model.n_layers (did you mean model.n_layer?)"),
        (["schedule.warmup=5"], "schedule.warmup (did you mean schedule.warmup_steps?)"),
        (["+wandb.api_key=abc"], "unknown config key wandb.api_key"),
        (["optimizer=mars-adamww"], "unknown optimizer 'mars-adamww' (did you mean optimizer=mars-adamw?); valid: adamw, adamw-schedulefree, ademamix, lion,"),
        (["model=gpt2-smal"], "unknown model 'gpt2-smal' (did you mean model=gpt2-small?)"),
        (["data=owt"], "unknown data 'owt'"),
        (["schedule=cosin"], "(did you mean schedule=cosine?)"),
        (["experiment=owt/small-adamx"], "(did you mean experiment=owt/small-adamw?)"),
        (["--multirun", "optimizer=adamw,mars-adamww"], "unknown optimizer 'mars-adamww'"),
        (["+schema/optimizer=adamw"], "unknown config group schema/optimizer"),
        (["+shared=small"], "unknown config key shared"),
        (["modle=tiny"], "unknown config key modle (did you mean model?)"),
        (["max_steps=(1"], "config error: "),  # a syntax error: Hydra's first line
        # an earlier version's switches: the one setting that replaced them
        (["optimizer=mars-adamw", "optimizer.fused=engine"], "config error: optimizer.fused was replaced by optimizer.implementation (docs/optim-engine.md)"),
        (["optimizer.foreach=false"], "optimizer.foreach was replaced by optimizer.implementation"),
        (["+optimizer.fused=true"], "optimizer.fused was replaced by optimizer.implementation"),
    ],
)  # fmt: skip
def test_misspelt_name_is_refused_with_one_line(args, expected):
    assert expected in refused(*args)


def test_an_earlier_versions_switch_in_a_yaml_file_is_refused_with_one_line():
    """``fused:`` under ``optimizer:`` in an experiment file (an earlier version's switch) fails
    Hydra's composition as this override does: the one line naming its replacement."""
    with pytest.raises(SystemExit) as info:
        command_line.check_composition(["optimizer=mars-adamw", "optimizer.fused=true"])
    message = str(info.value.code)
    assert "\n" not in message and "optimizer.fused" in message, message


@pytest.mark.parametrize(
    "args",
    [
        ["optimizer=mars-adamw", "optimizer.gamma=0.1", "optimizer.lr=1e-3,2e-3", "--multirun"],
        ["experiment=owt/small-mars-adamw", "optimizer.gamma=0.1"],
        ["hydra/launcher=submitit_local", "+hydra.job.env_set.X=1", "wandb.tags=[a,b]"],
        ["~wandb.entity", "--cfg", "job", "model.n_layer=2", "name=try2"],
        ["--multirun", "optimizer=glob(mars-*)", "optimizer.gamma=0.1", "seed=range(1,3)"],
        ["--multirun", "optimizer.lr=interval(1e-4,1e-3)"],
    ],
)
def test_real_names_pass(args):
    command_line.check_command_line(args)


def test_eval_names_are_checked_too():
    with pytest.raises(ValueError, match=r"limt \(did you mean limit\?\)"):
        cli_checks.check_eval_overrides([cli_checks.Override("limt")])


CHECK_ONLY = """
import runpy, sys
sys.path.insert(0, {root!r})  # as `python train.py` puts the script's directory first
sys.argv = [{script!r}, *{args!r}]
try:
    runpy.run_path({script!r}, run_name="__main__")
except SystemExit as exc:
    print("torch imported:", "torch" in sys.modules)
    raise
"""


@pytest.mark.parametrize(
    "script,args,expected",
    [
        ("train.py", ["max_step=10"], "max_step (did you mean max_steps?)"),
        ("train.py", ["optimizer=mars-adamww"], "did you mean optimizer=mars-adamw?"),
        ("eval.py", ["limt=5"], "limt (did you mean limit?)"),
    ],
)
def test_command_line_error_comes_before_torch_and_creates_nothing(
    tmp_path, script, args, expected
):
    """The real entry points: exit 1, one line on stderr, no traceback, nothing created, and
    torch never imported (the error comes in about a second, not after the imports)."""
    code = CHECK_ONLY.format(root=str(ROOT), script=str(ROOT / script), args=args)
    env = {**os.environ, "WANDB_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("config error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert expected in proc.stderr
    assert "torch imported: False" in proc.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_help_lists_only_the_groups_a_user_chooses():
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    groups = proc.stdout.split("== Configuration groups ==")[1].split("== Config ==")[0]
    experiments = next(line for line in groups.splitlines() if line.startswith("experiment: "))
    assert (
        "optimizer: adamw, adamw-schedulefree, ademamix, lion, mars-adamw," in groups
        and " demo," in experiments
    )
    assert "schema" not in proc.stdout and "shared" not in groups


# --- the same command continues its run ---------------------------------------------------------

# train.py, killed by the signal SIG at step AT (as by `kill -9` or a cluster's SIGTERM) when
# those are set in the environment; otherwise train.py itself.
HOOKED_TRAIN = """
import os, signal, sys
sys.path.insert(0, {root!r})
import trainer.trainer as t
original = t.Trainer.train_step
def train_step(self):
    if os.environ.get("AT") and self.state.step + 1 == int(os.environ["AT"]):
        os.kill(os.getpid(), getattr(signal, os.environ["SIG"]))
    return original(self)
t.Trainer.train_step = train_step
import train
from trainer.command_line import cli
cli(train.train)
"""
DROP = ("tokens_per_s", "elapsed_s", "mfu", "eta_s", "clip_rate")


def launch(cwd: Path, args: list[str], **env: str) -> subprocess.CompletedProcess:
    script = cwd / "train_hooked.py"
    script.write_text(HOOKED_TRAIN.format(root=str(ROOT)))
    full_env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", **env}
    return subprocess.run([sys.executable, str(script), *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def numbers(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(ln).items() if k not in DROP} for ln in lines]


@pytest.fixture(scope="module")
def command(sotu_dir) -> list[str]:
    return [*FAST, f"data.dir={sotu_dir}", "max_steps=6", "ckpt_every=2", "eval_every=3",
            "schedule.decay_steps=6", "model.dropout=0.1"]  # fmt: skip


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, command) -> Path:
    cwd = tmp_path_factory.mktemp("straight")
    proc = launch(cwd, command)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = (cwd / "runs").iterdir()
    return run_dir


@pytest.mark.slow
def test_the_same_command_continues_after_a_stop_and_a_kill(tmp_path, command, uninterrupted):
    """A cluster's SIGTERM at step 3 (a checkpoint there, the requeue status), then, relaunched,
    ``kill -9`` at step 5 (the last checkpoint is step 4's): the same command each time, and
    the run ends with the numbers of the uninterrupted one."""
    stopped = launch(tmp_path, command, AT="3", SIG="SIGTERM")
    assert stopped.returncode == REQUEUE_EXIT_CODE, stopped.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name == uninterrupted.name  # no time stamp: the command names the directory
    assert (  # the message says how to continue: the same command
        "to continue, run the same command again: python train_hooked.py"
        in stopped.stdout + stopped.stderr
    )
    killed = launch(tmp_path, command, AT="5", SIG="SIGKILL")
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert "resumed from" in killed.stdout + killed.stderr
    again = launch(tmp_path, command)  # the identical command
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in again.stdout + again.stderr
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [run_dir.name]
    assert numbers(run_dir) == numbers(uninterrupted)


@pytest.mark.parametrize(
    "override,expected",
    [
        (
            "max_steps=many",
            "max_steps: Value 'many' of type 'str' could not be converted to Integer",
        ),
        ("progress=maybe", "progress: Value 'maybe' is not a valid bool"),
    ],
)
def test_value_of_the_wrong_type_is_one_line_too(override, expected):
    """What Hydra itself reports when it composes (five lines) is one line as well."""
    with pytest.raises(SystemExit) as info:
        command_line.check_composition([override])
    message = str(info.value.code)
    assert message.startswith(f"config error: {expected}")
    assert "\n" not in message
    command_line.check_composition(["max_steps=7", "+hydra.job.env_set.X=1"])  # fine
