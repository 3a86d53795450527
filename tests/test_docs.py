"""The documentation holds together: every relative link of README.md and docs/*.md points to a
file that exists (and, with a ``#fragment`` into a Markdown file, to a heading it has), and the
README stays short enough to read on a few screens (the long material lives in docs/)."""

import re
from pathlib import Path

import pytest

from helpers import ROOT

README_MAX_LINES = 350
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# [text](target) and ![alt](target); the target ends at whitespace or ")" (an optional "title"
# after a space is ignored). Code spans and fenced blocks are removed first.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def links(text: str) -> list[str]:
    """The link targets of a Markdown text, outside code blocks and code spans."""
    text = CODE_SPAN.sub("", FENCE.sub("", text))
    return LINK.findall(text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = CODE_SPAN.sub(lambda m: m.group(0)[1:-1], heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, with GitHub's -1, -2 suffixes for repeats."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        match = re.match(r"#{1,6}\s+(.*)", line)
        if not match:
            continue
        base = slug(match.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` that point nowhere, each with the reason."""
    bad = []
    for target in links(page.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, mailto:, ...
            continue
        path_part, _, fragment = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            bad.append(f"{target}: no file {dest}")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            bad.append(f"{target}: no heading #{fragment} in {dest.name}")
    return bad


def test_the_helpers_find_links_and_anchors(tmp_path):
    page = tmp_path / "a.md"
    page.write_text(
        "# A page\n\n## 1.2 Commands (`x`)\n\n## Notes\n\n## Notes\n\n"
        "[ok](a.md#notes-1) ![img](b.png) [web](https://example.org) `[no](c.md)`\n"
        "```\n[no](d.md)\n# not a heading\n```\n[gone](e.md) [bad](#missing) [top](#a-page)\n"
    )
    (tmp_path / "b.png").write_bytes(b"")
    assert links(page.read_text()) == [
        "a.md#notes-1", "b.png", "https://example.org", "e.md", "#missing", "#a-page"
    ]  # fmt: skip
    assert anchors(page) == {"a-page", "12-commands-x", "notes", "notes-1"}
    assert [b.split(":")[0] for b in broken_links(page)] == ["e.md", "#missing"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_readme_fits_on_a_few_screens():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/"


def test_readme_lists_every_registered_optimizer():
    """The README's Optimizers table names exactly the registered optimizers, plus the exact-mode
    configs (``configs/optimizer/*-exact.yaml``): a new optimizer is not hidden from readers."""
    import optim

    section = (ROOT / "README.md").read_text().split("## Optimizers\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    named = {n for row in rows for n in re.findall(r"`([a-z0-9-]+)`", row.split("|")[1])}
    exact = {p.stem for p in (ROOT / "configs" / "optimizer").glob("*-exact.yaml")}
    assert named == set(optim.available()) | exact


def test_readme_ci_time_is_its_record():
    """README's sentence on .ci/run's time says what the record it links says."""
    import re

    text = (ROOT / "README.md").read_text()
    name = re.search(r"bench/records/(ci-\d+\.txt)", text).group(1)
    rec = (ROOT / "bench" / "records" / name).read_text()
    assert "rc=0" in rec
    passed, skipped, secs = re.search(r"(\d+) passed, (\d+) skipped, .* in ([\d.]+)s", rec).groups()
    elapsed = int(re.search(r"elapsed=(\d+)s", rec).group(1))
    said = " ".join(text.split())  # (the sentence wraps)
    assert f"took {elapsed // 60} min {elapsed % 60} s" in said
    assert f"({int(passed) + int(skipped):,} tests, {skipped} of them skipped" in said
    pytest_s = round(float(secs))
    assert f"without CUDA: {pytest_s // 60} min {pytest_s % 60} s;" in said
