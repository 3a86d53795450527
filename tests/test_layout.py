"""The layout's dependency rules (README "Layout"), read from the import statements."""

import ast
import sys

import pytest

from helpers import ROOT

PROJECT = {"data", "model", "optim", "runtime", "evals", "scripts", "train", "eval"}
# What each part may import of the project besides itself.
ALLOWED = {
    "data": {"runtime.files"},  # the atomic file writer, a standard-library leaf
    "optim": set(),  # torch only: importable on its own
    "model": {"data.tokenizer", "runtime.device", "runtime.files"},
    "runtime": {"data", "model", "optim"},  # the training config composes the parts' configs
    "evals": {"data", "model", "runtime"},
}


def imports(path):
    """Absolute module names imported anywhere in ``path`` (top level or inside functions)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return names


def sources(part):
    return sorted((ROOT / part).rglob("*.py"))


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_parts_import_only_what_the_layout_allows(part):
    allowed = ALLOWED[part]
    for path in sources(part):
        for name in imports(path):
            top = name.split(".")[0]
            if top not in PROJECT or top == part:
                continue
            ok = any(name == a or name.startswith(a + ".") for a in allowed)
            parent_ok = any(a.startswith(name + ".") for a in allowed)  # from runtime import files
            assert ok or parent_ok, f"{path.relative_to(ROOT)} imports {name}"


def test_runtime_files_is_a_standard_library_leaf():
    for name in imports(ROOT / "runtime" / "files.py"):
        assert name.split(".")[0] in sys.stdlib_module_names, name


def test_only_the_entry_points_import_hydra_or_omegaconf():
    parts = ["data", "model", "optim", "runtime", "evals", "scripts"]
    code = [ROOT / "train.py", ROOT / "eval.py", *(p for part in parts for p in sources(part))]
    users = {
        p.relative_to(ROOT).as_posix()
        for p in code
        if any(n.startswith(("hydra", "omegaconf")) for n in imports(p))
    }
    assert users <= {"train.py", "eval.py"} and "train.py" in users


def test_scripts_leave_sys_path_alone():
    for path in sources("scripts"):
        assert (
            "sys.path.insert" not in path.read_text() and "sys.path.append" not in path.read_text()
        ), path
