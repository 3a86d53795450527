"""Lists that cannot go stale: every list of optimizers, models, datasets, schedules, data
sources, experiments or preconditioners in README.md and docs/ (docs/study* aside: the study's
own pages) is checked against the registry it copies.

A list says what it lists with an HTML comment, invisible on the rendered page:

- ``<!-- every KIND -->`` inside a paragraph, list or table covers the text from the previous
  marker of that block (or the block's start) up to itself: every member of KIND must be named
  there (as a whole word, in backticks or not: ``mars-m`` is not named by ``mars-m-efficient``);
- the same comment alone as a block (blank lines around it) covers the whole next block, e.g. a
  table whose rows name one member each;
- ``<!-- some KIND -->`` marks a deliberate subset (checked for nothing but being a subset's
  mark).

A block that names half or more of a kind's members without such a mark fails, so a new list
is either checked or declared partial.
"""

from __future__ import annotations

import re

import pytest

from helpers import ROOT

PAGES = [
    ROOT / "README.md",
    *sorted(p for p in (ROOT / "docs").glob("*.md") if not p.name.startswith("study")),
]
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
MARK = re.compile(r"<!--\s*(every|some)\s+([a-z ]+?)\s*-->")
CODE_SPAN = re.compile(r"`[^`\n]*`")


def marks_in(block: str) -> list[re.Match]:
    """The marks of a block, outside code spans (a page may show a mark as an example)."""
    return list(MARK.finditer(CODE_SPAN.sub(lambda m: " " * len(m.group(0)), block)))


def _stems(group: str) -> set[str]:
    return {p.stem for p in (ROOT / "configs" / group).glob("*.yaml")}


def registries() -> dict[str, set[str]]:
    """KIND -> its members: the config groups' files (what ``group=NAME`` takes), the optimizer
    and preconditioner registries and the named sources of ``python -m data.prepare``."""
    import optim
    from data.catalog import SOURCES
    from optim.preconditioners import PRECONDITIONERS

    experiments = ROOT / "configs" / "experiment"
    return {
        "optimizer": _stems("optimizer"),  # the registered ones and their exact-mode configs
        "registered optimizer": set(optim.available()),
        "model": _stems("model"),
        "dataset": _stems("data"),
        "schedule": _stems("schedule"),
        "source": set(SOURCES),
        "preconditioner": set(PRECONDITIONERS),
        # configs/experiment/: its folders (``owt/``) and its files (``demo``)
        "experiment": {p.name + "/" for p in experiments.iterdir() if p.is_dir()}
        | _stems("experiment"),
    }


# The kinds a block is watched for, and the marks that answer for each.
WATCHED = {
    "optimizer": {"optimizer", "registered optimizer"},
    "model": {"model"},
    "dataset": {"dataset", "source"},
    "schedule": {"schedule"},
}


def blocks(text: str) -> list[str]:
    """The blocks of a Markdown text (runs of non-blank lines), code blocks blanked out: a
    command line is not a list."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return [b for b in re.split(r"\n[ \t]*\n", text) if b.strip()]


def marked_lists(text: str) -> list[tuple[str, str, str]]:
    """(every|some, KIND, the text the mark covers) for each mark of a Markdown text."""
    found = []
    parts = blocks(text)
    for i, block in enumerate(parts):
        alone = MARK.fullmatch(block.strip())
        if alone:
            following = parts[i + 1] if i + 1 < len(parts) else ""
            found.append((alone.group(1), alone.group(2), following))
            continue
        start = 0
        for mark in marks_in(block):
            found.append((mark.group(1), mark.group(2), block[start : mark.start()]))
            start = mark.end()
    return found


def named(text: str, members: set[str]) -> set[str]:
    """The members ``text`` names as whole words (a name's hyphens are part of the word)."""
    return {m for m in members if re.search(rf"(?<![\w-]){re.escape(m)}(?![\w-])", text)}


def missing(scope: str, members: set[str]) -> set[str]:
    """The members a list does not name."""
    return members - named(scope, members)


def unmarked_lists(text: str, kinds: dict[str, set[str]]) -> list[str]:
    """'KIND: block start' for each block naming half or more (at least 3) of a watched kind's
    members without a mark for it (in the block, or alone just above it)."""
    bad = []
    parts = blocks(text)
    for i, block in enumerate(parts):
        above = MARK.fullmatch(parts[i - 1].strip()) if i else None
        marks = {m.group(2) for m in marks_in(block)} | ({above.group(2)} if above else set())
        for kind, answers in WATCHED.items():
            members = kinds[kind]
            if (
                len(named(block, members)) >= max(3, (len(members) + 1) // 2)
                and not marks & answers
            ):
                bad.append(f"{kind}: {block.strip()[:70]!r}")
    return bad


def test_the_helpers_read_marks_blocks_and_scopes():
    kinds = {"model": {"a", "b", "c"}, "optimizer": {"x", "y", "z", "w"},
             "dataset": {"d1", "d2", "d3"}, "schedule": {"s1"}}  # fmt: skip
    text = (
        "Models: `a`, `b`, `c` <!-- every model -->; optimizers `x`, `y`\n"
        "<!-- every optimizer -->.\n\n```\n`x` `y` `z` `w`\n```\n\n"
        "<!-- some dataset -->\n\n| d |\n|---|\n| `d1` |\n| `d2` |\n\n"
        "Unmarked: `x`, `y`, `z`, `d1`, `<!-- every optimizer -->` shown.\n"
    )
    marks = marked_lists(text)
    assert [(m[0], m[1]) for m in marks] == [
        ("every", "model"), ("every", "optimizer"), ("some", "dataset")
    ]  # fmt: skip
    assert missing(marks[0][2], kinds["model"]) == set()
    assert missing(marks[1][2], kinds["optimizer"]) == {"z", "w"}  # the code block is no list
    assert "`d2`" in marks[2][2]
    assert [u.split(":")[0] for u in unmarked_lists(text, kinds)] == ["optimizer"]
    names = {"adamw", "mars-adamw", "mars-m", "mars-m-efficient"}
    assert named("mars-m-efficient and `mars-adamw`", names) == {"mars-m-efficient", "mars-adamw"}


def test_every_page_names_only_known_kinds():
    kinds = registries()
    for page in PAGES:
        for _, kind, _ in marked_lists(page.read_text()):
            assert kind in kinds, f"{page.relative_to(ROOT)}: unknown kind {kind!r} in a mark"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_marked_list_names_every_member(page):
    kinds = registries()
    for how, kind, scope in marked_lists(page.read_text()):
        if how == "every" and kind in kinds:
            gone = missing(scope, kinds[kind])
            assert not gone, f"the list of every {kind} lacks {sorted(gone)}: {scope[:70]!r}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_long_list_is_marked(page):
    assert unmarked_lists(page.read_text(), registries()) == []


def test_the_lists_the_issue_named_are_checked():
    """The lists that went stale once carry their marks (a mark removed is a list unchecked)."""
    want = {
        "docs/training.md": {"model", "dataset", "optimizer", "schedule", "experiment"},
        "README.md": {"model", "dataset", "schedule", "optimizer"},
        "docs/optimizers.md": {"registered optimizer"},
        "docs/models.md": {"model"},
        "docs/fsdp-optimizers.md": {"registered optimizer"},
    }
    for name, kinds in want.items():
        marks = {kind for how, kind, _ in marked_lists((ROOT / name).read_text()) if how == "every"}
        assert kinds <= marks, f"{name}: no mark for {sorted(kinds - marks)}"


def test_the_readmes_optimizer_table_is_the_registrys():
    """README's table of optimizers is rendered from each spec's description and the exact-mode
    configs (scripts/optimizer_table.py): a registered optimizer appears there by registering."""
    from scripts import optimizer_table

    block = optimizer_table.MARK.search((ROOT / "README.md").read_text())
    assert block, "README.md lacks its '<!-- optimizers: ... -->' block"
    assert block[2] == optimizer_table.table(), (
        "run: python -m scripts.optimizer_table --readme README.md"
    )
