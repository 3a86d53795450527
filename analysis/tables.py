"""Markdown tables: the one helper the report's tables go through (``markdown_table``), and
the study's as they move onto it."""

from __future__ import annotations


def markdown_table(headers: list[str], rows: list[list], *, compact: bool = False) -> str:
    """A GitHub-flavoured Markdown table, ``|`` in cells escaped. ``compact``: the line under
    the headers as ``|---|---|`` (the study's tables) instead of ``| --- | --- |``."""

    def line(cells: list) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    under = "|" + "---|" * len(headers) if compact else line(["---"] * len(headers))
    return "\n".join([line(headers), under, *map(line, rows)])
