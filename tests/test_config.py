import itertools

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf.errors import ConfigKeyError, ValidationError

import train
from helpers import CONFIG_DIR, compose_config
from trainer.config import TrainConfig


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def test_groups_are_not_empty():
    for group in ("model", "data", "optimizer", "schedule"):
        assert options(group), group


# Every option of every group appears in some combination (the full product is ~800 configs).
COMBOS = [(m, d, "adamw", s) for m, d, s in itertools.product(
    options("model"), options("data"), options("schedule"))] + [
    ("gpt2-small", "openwebtext", o, "cosine") for o in options("optimizer")]  # fmt: skip


@pytest.mark.parametrize("model,data,optimizer,schedule", COMBOS)
def test_every_config_composes(model, data, optimizer, schedule):
    cfg = compose_config(
        f"model={model}", f"data={data}", f"optimizer={optimizer}", f"schedule={schedule}"
    )
    typed, plain = train.to_typed(cfg)
    assert isinstance(typed, TrainConfig)
    assert typed.model.name == model
    # data.name is the source prepared on first use: sotu-bytes is the sotu corpus as bytes
    assert typed.data.name == data.removesuffix("-bytes")
    assert plain["optimizer"]["name"] == typed.optimizer.name


def test_default_config():
    typed, _ = train.to_typed(compose_config())
    assert typed.model.name == "tiny" and typed.data.name == "sotu"
    assert typed.optimizer.name == "adamw" and typed.schedule.name == "cosine"


@pytest.mark.parametrize("override", ["max_stepz=3", "model.n_layr=2", "optimizer.lrr=1e-3"])
def test_typo_fails_at_composition(override):
    with pytest.raises((ConfigCompositionException, ConfigKeyError)):
        compose_config(override)


def test_wrong_type_fails_at_composition():
    with pytest.raises((ConfigCompositionException, ValidationError)):
        compose_config("max_steps=many")


@pytest.mark.parametrize("group", ["optimizer", "model", "data"])
def test_unknown_name_lists_valid_ones(group):
    with pytest.raises(MissingConfigException) as info:
        compose_config(f"{group}=nonexistent")
    for name in options(group):
        assert name in str(info.value)


def test_bad_value_is_a_clear_error():
    with pytest.raises(SystemExit, match="max_steps must be >= 1"):
        train.to_typed(compose_config("max_steps=0"))
    with pytest.raises(SystemExit, match="valid modes"):
        train.to_typed(compose_config("wandb.mode=loud"))
    with pytest.raises(SystemExit, match="valid schedules"):
        train.to_typed(compose_config("schedule.name=linear"))
