"""Plain-text and markdown tables for metrics, shared by the CLI, the demo and the reports."""

from __future__ import annotations

from typing import Any


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 10 else f"{value:.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def markdown_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A GitHub-markdown table (also readable in a terminal), one row per dict."""
    cells = [[_cell(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = lambda vals: (
        "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths, strict=True)) + " |"
    )
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(columns), sep, *(line(r) for r in cells)])
