"""A new optimizer costs the files docs/adding-an-optimizer.md counts, no more and no fewer.

The page's optimizer (MARS-Adafactor: sections 1 and 2 are ``optim/adafactor.py``, section 3 is
its YAML) is written into a copy of the repository in a temporary directory (the other files are
links to this checkout's) and registered; then what the suite asks of every registered optimizer
is asked of it: the contract (tests/test_optim_contract.py), one lr for the non-matrix parameters
(tests/test_optim_aux_lr.py), every config field acts (tests/test_optim_configs.py), its YAML
composes and its keys are read from its source by the command line's check (tests/test_cli.py),
its routing on a LLaMA (tests/test_llama.py), its state on the meta device
(tests/test_memory.py), and every list of optimizers in README.md and docs/
(tests/test_doc_lists.py). The files those checks need are the page's list under "The files,
counted", exactly.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import types
from pathlib import Path

import pytest
import test_doc_lists
import test_llama
import test_optim_aux_lr
import test_optim_configs
import test_optim_contract

import optim
import optim.options
import optim.preconditioners
import optim.registry
from helpers import ROOT

RECIPE = ROOT / "docs" / "adding-an-optimizer.md"
NAME = "mars-adafactor"
MODULE = "optim/adafactor.py"
YAML = f"configs/optimizer/{NAME}.yaml"
# Files that every new optimizer has, whatever the checks below find: its module, the import
# that registers it when train.py starts, its YAML and its own test against its paper.
OWN = {MODULE, "optim/__init__.py", YAML, "tests/test_optim_adafactor.py"}


def recipe_sources() -> tuple[str, str]:
    """The page's module (its first two Python blocks, one file) and its YAML file."""
    text = RECIPE.read_text()
    python = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    return python[0] + "\n" + python[1], re.findall(r"```yaml\n(.*?)```", text, flags=re.S)[0]


def counted() -> set[str]:
    """The files the page counts: the paths in backticks that open the items of its list under
    "The files, counted"."""
    section = RECIPE.read_text().split("## The files, counted\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^- `([^`]+)`", section, flags=re.M))


def _mirror(src: Path, dst: Path, own: dict[str, str]) -> None:
    """``dst`` as ``src`` with links to its entries, a folder of links where ``own`` writes a
    file below it, and ``own``'s files (relative path -> text) written."""
    dst.mkdir()
    here = {rel.split("/", 1)[0] for rel in own}
    for entry in src.iterdir():
        if entry.name not in here and not entry.name.startswith("."):
            (dst / entry.name).symlink_to(entry)
    for top in here:
        below = {rel.split("/", 1)[1]: text for rel, text in own.items() if "/" in rel
                 and rel.split("/", 1)[0] == top}  # fmt: skip
        if below:
            _mirror(src / top, dst / top, below)
        else:
            (dst / top).write_text(own[top])


@pytest.fixture(scope="module")
def added(tmp_path_factory):
    """The page's optimizer registered (its module run as ``optim.adafactor``), the command line's
    check reading a copy of the repository with its two new files; everything restored after."""
    from runtime import config_files
    from trainer import cli_checks

    module_text, yaml_text = recipe_sources()
    tree = tmp_path_factory.mktemp("repo") / "repo"
    _mirror(ROOT, tree, {MODULE: module_text, YAML: yaml_text})
    tables = (optim.registry._REGISTRY, optim.preconditioners.PRECONDITIONERS,
              optim.options.VALIDATORS)  # fmt: skip
    saved = [dict(t) for t in tables]
    patch = pytest.MonkeyPatch()
    caches = (cli_checks.optimizer_fields, cli_checks._module, cli_checks.group_options)
    try:
        module = types.ModuleType("optim.adafactor")
        module.__file__ = str(tree / MODULE)
        patch.setitem(sys.modules, "optim.adafactor", module)
        exec(compile(module_text, module.__file__, "exec"), module.__dict__)  # noqa: S102
        patch.setattr(cli_checks, "ROOT", tree)
        patch.setattr(config_files, "ROOT", tree)
        patch.setattr(config_files, "CONFIGS", tree / "configs")
        for cache in caches:
            cache.cache_clear()
        yield tree
    finally:
        patch.undo()
        for cache in caches:
            cache.cache_clear()
        for table, old in zip(tables, saved):
            table.clear()
            table.update(old)
        from hydra.core.config_store import ConfigStore

        ConfigStore.instance().repo.get("schema", {}).get("optimizer", {}).pop(f"{NAME}.yaml", 0)


def doc_pages_to_extend(tree: Path) -> set[str]:
    """README.md and docs/ pages with a list of every optimizer that does not name ``NAME``."""
    kinds = test_doc_lists.registries()
    kinds["optimizer"] |= {p.stem for p in (tree / "configs" / "optimizer").glob("*.yaml")}
    assert NAME in kinds["optimizer"] and NAME in kinds["registered optimizer"]
    pages = set()
    for page in test_doc_lists.PAGES:
        for how, kind, scope in test_doc_lists.marked_lists(page.read_text()):
            if (
                how == "every"
                and kind in kinds
                and NAME in test_doc_lists.missing(scope, kinds[kind])
            ):
                pages.add(page.relative_to(ROOT).as_posix())
    return pages


def test_the_recipe_counts_the_files_the_suite_needs(added):
    need = OWN | doc_pages_to_extend(added)
    test_llama.expected_routing(NAME)  # a MarsConfig: MARS's row, tests/test_llama.py unchanged
    listed = counted()
    assert listed == need, (
        f"docs/adding-an-optimizer.md, 'The files, counted': add {sorted(need - listed)}, "
        f"drop {sorted(listed - need)}"
    )


def test_it_keeps_the_contract_of_every_optimizer(added):
    for kw in ({}, {"mode": "exact"}):
        test_optim_contract.test_state_dict_round_trip_and_resume(NAME, kw)
        test_optim_contract.test_zero_grad_either_way(NAME, kw)
    test_optim_contract.test_parameters_without_grad_untouched(NAME)
    test_optim_contract.test_lr_scheduler_and_groups(NAME)
    for field, value in (("lr", -1.0), ("weight_decay", -0.1), ("betas", [1.5])):
        test_optim_contract.test_bad_hyperparameters_rejected(NAME, field, value)


def test_it_has_aux_lr_and_every_field_acts(added):
    test_optim_aux_lr.test_every_optimizer_has_the_field()
    for arch in test_optim_aux_lr.MODELS:
        test_optim_aux_lr.test_moving_to_an_aux_group_at_the_same_lr_changes_no_bit(NAME, arch)
        test_optim_aux_lr.test_set_moves_only_the_lr_of_the_non_matrix_parameters(NAME, arch)
        test_optim_aux_lr.test_set_steps_each_parameter_as_the_optimizer_at_that_lr(NAME, arch)
    for field in dataclasses.fields(optim.get_spec(NAME).config_cls):
        if field.name != "name":
            test_optim_configs.test_every_config_field_changes_the_run_or_is_rejected(
                NAME, field.name
            )


def test_its_yaml_composes_and_the_command_line_knows_its_keys(added):
    import test_cli
    from hydra import compose, initialize_config_dir

    from trainer import cli_checks, command_line

    command_line.register_schemas()
    with initialize_config_dir(config_dir=str(added / "configs"), version_base=None):
        cfg = compose(config_name="config", overrides=[f"optimizer={NAME}", "optimizer.gamma=0.05"])
    typed, _ = command_line.to_typed(cfg)
    assert type(typed.optimizer).__name__ == "MarsAdafactorConfig" and typed.optimizer.gamma == 0.05
    found = cli_checks.optimizer_fields()
    assert sorted(found) == optim.available()
    assert found[NAME] == test_cli.real_fields(optim.get_spec(NAME).config_cls)
    overrides = [cli_checks.Override("optimizer", (NAME,)),
                 cli_checks.Override("optimizer.factored_esp")]  # fmt: skip
    with pytest.raises(ValueError, match=r"optimizer\.factored_esp \(did you mean "
                       r"optimizer\.factored_eps\?\)"):  # fmt: skip
        cli_checks.check_train_overrides(overrides)


def test_it_routes_a_llama_as_its_family_and_its_state_is_planned(added):
    from test_memory import test_meta_state_bytes_equal_real_ones

    from model import build_model

    model = build_model(test_llama.preset("llama-tiny"))
    assert test_llama.routes_of(model, NAME) == test_llama.expected_routing(NAME)
    cls = optim.get_spec(NAME).config_cls
    for label, cfg in ((NAME, cls()), (f"{NAME} exact", cls(mode="exact"))):
        test_meta_state_bytes_equal_real_ones(label, cfg)


def test_its_step_is_not_launch_bound(added):
    from test_launch_count import test_launches_bounded_and_flat_in_depth

    test_launches_bounded_and_flat_in_depth(NAME)
