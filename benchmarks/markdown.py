"""The one Markdown table writer of the benchmark reports (:mod:`benchmarks.report` and its projection section,
:mod:`benchmarks.projection_report`)."""

from __future__ import annotations

from typing import Sequence


def markdown_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """A GitHub Markdown table of formatted cells (pandas' to_markdown needs tabulate, which is not installed)."""
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines) + "\n"
