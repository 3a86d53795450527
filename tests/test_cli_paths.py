"""The project's own run and sweep directories (runs/NAME_optimizer.lr=0.003,seed=2, their '='
and ',' refused or read as a sweep by Hydra's override grammar) are accepted by every entry
point's path keys, and eval.py checks the checkpoint before anything else."""

import importlib

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser

from helpers import CONFIG_DIR
from trainer.cli_checks import EVAL_PATH_KEYS, TRAIN_PATH_KEYS, quote_paths

eval_py = importlib.import_module("eval")
RUN = "runs/sotu-tiny-sweep_max_steps=20/optimizer.lr=0.003,seed=2"


def compose_eval(*overrides):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(config_name="eval", overrides=list(overrides))
    return eval_py.to_typed(cfg)


def parsed_value(arg: str) -> str:
    return OverridesParser.create().parse_overrides([arg])[0].value()


@pytest.mark.parametrize("key", EVAL_PATH_KEYS)
def test_eval_path_keys_take_a_run_directory_name(key):
    with pytest.raises(Exception, match="mismatched input"):  # what the user met
        parsed_value(f"{key}={RUN}")
    (arg,) = quote_paths([f"{key}={RUN}"], EVAL_PATH_KEYS)
    assert parsed_value(arg) == RUN


def test_train_path_keys_are_quoted_but_an_out_dir_sweep_stays_a_sweep():
    args = [f"resume={RUN}", f"data.dir={RUN}", "out_dir=a,b", f"out_dir={RUN}", "seed=1,2",
            "resume='already/quoted=1'"]  # fmt: skip
    quoted = quote_paths(args, TRAIN_PATH_KEYS, sweepable=("out_dir",))
    assert [parsed_value(a) for a in quoted[:2]] == [RUN, RUN]
    assert quoted[2:4] == ["out_dir=a,b", f"out_dir='{RUN}'"]  # '=' always needs the quotes
    assert quoted[4:] == ["seed=1,2", "resume='already/quoted=1'"]


def test_eval_checks_the_checkpoint_before_the_task_data(tmp_path):
    missing = tmp_path / "runs" / "x_optimizer.lr=0.003"
    cfg = compose_eval(f"checkpoint='{missing}'", "tasks=[hellaswag]",
                       f"data_dir={tmp_path / 'no-task-data'}")  # fmt: skip
    with pytest.raises(SystemExit) as info:
        eval_py.evaluate(cfg)
    message = str(info.value.code)
    assert message.startswith(f"error: checkpoint={missing} does not exist")
    assert "hellaswag" not in message.lower() and "\n" not in message
