"""The layout's dependency rules (docs/design.md, README "Where things are"), read from the import
statements."""

import ast
import re
import sys

import pytest

from helpers import ROOT

PROJECT = {
    "analysis", "bench", "data", "eval", "evals", "model", "optim", "report", "runtime", "scripts", "study",
    "train", "trainer",
}  # fmt: skip
# What each part may import of the project besides itself: every arrow points down the layers
# runtime (leaf) < data < model < optim (torch only) < trainer < tools and entry points.
ALLOWED = {
    "runtime": set(),  # the leaf: device, distributed, files, seeding
    "analysis": set(),  # numpy only: statistics, speedups, colours under study/ and report/
    "data": {"runtime"},
    "optim": set(),  # torch only: importable on its own
    "model": {"data.tokenizer", "runtime"},
    "trainer": {"data", "model", "optim", "runtime"},
    "evals": {"data", "model", "runtime", "trainer.checkpoint", "trainer.dcp_checkpoint"},
    "report": {
        "analysis",
        "evals.tasks",
        "runtime.runfiles",
    },  # run directories read through runfiles
    "bench": {"data", "model", "optim", "runtime", "trainer", "train"},
    # no benchmarks: the launcher plans micro-batches with trainer.memory_plan (a plan of a run)
    "scripts": {"data", "model", "optim", "runtime", "trainer", "evals"},
    # launches train.py (runtime.commands), reads run directories (runtime.runfiles) and
    # configs/ (runtime.config_files)
    "study": {
        "analysis",
        "data",
        "model",
        "optim",
        "runtime.commands",
        "runtime.config_files",
        # its proxy's speed (study/findings/proxy_speed.py) sets its process up as train.py does
        "runtime.device",
        "runtime.distributed",
        "runtime.files",
        "runtime.runfiles",
        # its gradient instruments (study/findings/vr_probe.py, study/findings/predict.py) replay a recorded run
        # through the trainer, composed as train.py composes it
        "train",
        "trainer",
    },
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


def design_page_rules() -> dict[str, set[str]]:
    """docs/design.md's table of rooms: room -> the names (in backticks) of its "may import"
    cell; ``nothing`` is the empty set."""
    rules = {}
    for line in (ROOT / "docs" / "design.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        room = re.fullmatch(r"`(\w+)/`", cells[0]) if len(cells) == 3 else None
        if room:
            rules[room.group(1)] = set(re.findall(r"`([\w.]+)`", cells[2]))
    return rules


def test_the_design_page_states_these_rules():
    """docs/design.md says what each room may import: the same rules as ALLOWED, room by room."""
    assert design_page_rules() == ALLOWED


# The modules of study/ itself (the protocol) that may import study/findings/ (a finding's code,
# which stands on the protocol): the subcommand registry, the table writers, the parts' READMEs.
FINDINGS_DOORS = {"__main__.py", "parts.py", "part_readme.py"}


def test_the_protocol_imports_the_findings_only_through_its_doors():
    """study/findings/ stands on study/; of study/'s own modules only FINDINGS_DOORS import it."""
    for path in sorted((ROOT / "study").glob("*.py")):
        if path.name in FINDINGS_DOORS:
            continue
        for name in imports(path):
            assert not (name + ".").startswith("study.findings."), (
                f"{path.relative_to(ROOT)} imports {name}"
            )


def test_the_design_page_names_the_findings_doors():
    """docs/design.md's paragraph on study/findings/ names the same doors as FINDINGS_DOORS."""
    text = " ".join((ROOT / "docs" / "design.md").read_text().split())
    said = re.search(r"except the three doors to it: (.*?)\(`tests/test_layout.py`\)\.", text)
    assert said, "docs/design.md: the doors of study/findings/"
    assert set(re.findall(r"`(\w+\.py)`", said.group(1))) == FINDINGS_DOORS


def test_the_entry_points_import_no_tool():
    """train.py and eval.py stand on the rooms below them, never on a tool that uses them."""
    for entry in ("train.py", "eval.py"):
        tops = {name.split(".")[0] for name in imports(ROOT / entry)}
        assert not tops & {"bench", "scripts", "study", "report"}, (entry, tops)


def test_runtime_files_is_a_standard_library_leaf():
    for name in imports(ROOT / "runtime" / "files.py"):
        assert name.split(".")[0] in sys.stdlib_module_names, name


def test_only_the_command_lines_import_hydra_or_omegaconf():
    """eval.py and train.py's command line (trainer/command_line.py); train.py itself is the run."""
    parts = [
        "data",
        "model",
        "optim",
        "runtime",
        "trainer",
        "evals",
        "scripts",
        "bench",
        "report",
        "study",
    ]
    code = [ROOT / "train.py", ROOT / "eval.py", *(p for part in parts for p in sources(part))]
    users = {
        p.relative_to(ROOT).as_posix()
        for p in code
        if any(n.startswith(("hydra", "omegaconf")) for n in imports(p))
    }
    assert users <= {"eval.py", "trainer/command_line.py"} and "trainer/command_line.py" in users


def test_scripts_leave_sys_path_alone():
    for path in sources("scripts"):
        assert (
            "sys.path.insert" not in path.read_text() and "sys.path.append" not in path.read_text()
        ), path


def module_graph():
    """Every project module (``pkg.mod``) and the project modules it imports."""
    graph = {}
    for part in sorted(ALLOWED):
        for path in sources(part):
            mod = path.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
            mod = mod.removesuffix(".__init__").removesuffix(".__main__")
            graph[mod] = {d for d in module_imports(path) if d != mod}
    return graph


def module_imports(path):
    """The project modules ``path`` imports: ``from pkg import mod`` names ``pkg.mod``,
    ``from pkg.mod import f`` names ``pkg.mod``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            subs = [f"{node.module}.{a.name}" for a in node.names]
            names = [n for n in subs if _is_module(n)] or [node.module]
        else:
            continue
        found |= {n for n in names if n.split(".")[0] in PROJECT and _is_module(n)}
    return found


def _is_module(name):
    path = ROOT / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def test_no_import_circles():
    graph = module_graph()
    done, stack = set(), []

    def visit(mod):
        if mod in stack:
            cycle = stack[stack.index(mod) :] + [mod]
            raise AssertionError("import circle: " + " -> ".join(cycle))
        if mod in done:
            return
        stack.append(mod)
        for dep in sorted(graph.get(mod, ())):
            visit(dep)
        stack.pop()
        done.add(mod)

    for mod in sorted(graph):
        visit(mod)
