import itertools

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf.errors import ConfigKeyError, ValidationError

from helpers import CONFIG_DIR, compose_config
from trainer import command_line
from trainer.config import TrainConfig


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def test_groups_are_not_empty():
    for group in ("model", "data", "optimizer", "schedule"):
        assert options(group), group


def pairwise(models: list[str], datas: list[str], schedules: list[str]) -> list[tuple]:
    """Every (model, data) pair once, its schedule turning with both indices: with at least as
    many models and data sets as schedules, every (model, schedule) and (data, schedule) pair
    appears too, in a quarter of the full product's compositions (each takes about 0.3 s)."""
    assert min(len(models), len(datas)) >= len(schedules)
    return [(m, d, schedules[(i + j) % len(schedules)])
            for (i, m), (j, d) in itertools.product(enumerate(models), enumerate(datas))]  # fmt: skip


def test_the_pairs_cover_every_pair_of_options():
    groups = ("model", "data", "schedule")
    combos = pairwise(*(options(g) for g in groups))
    for a, b in itertools.combinations(range(3), 2):
        want = set(itertools.product(options(groups[a]), options(groups[b])))
        assert {(c[a], c[b]) for c in combos} == want, (groups[a], groups[b])


# Every pair of options of the model, data and schedule groups composes together, and every
# optimizer with one of them (the full product would be ~380 configs).
COMBOS = [(m, d, "adamw", s) for m, d, s in pairwise(
    options("model"), options("data"), options("schedule"))] + [
    ("gpt2-small", "openwebtext", o, "cosine") for o in options("optimizer")]  # fmt: skip


@pytest.mark.parametrize("model,data,optimizer,schedule", COMBOS)
def test_every_config_composes(model, data, optimizer, schedule):
    cfg = compose_config(
        f"model={model}", f"data={data}", f"optimizer={optimizer}", f"schedule={schedule}"
    )
    typed, plain = command_line.to_typed(cfg)
    assert isinstance(typed, TrainConfig)
    assert typed.model.name == model
    # data.name is the source prepared on first use: sotu-bytes is the sotu corpus as bytes
    assert typed.data.name == data.removesuffix("-bytes")
    assert plain["optimizer"]["name"] == typed.optimizer.name


def test_default_config():
    typed, _ = command_line.to_typed(compose_config())
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
        command_line.to_typed(compose_config("max_steps=0"))
    with pytest.raises(SystemExit, match="valid modes"):
        command_line.to_typed(compose_config("wandb.mode=loud"))
    with pytest.raises(SystemExit, match="valid schedules"):
        command_line.to_typed(compose_config("schedule.name=linear"))
