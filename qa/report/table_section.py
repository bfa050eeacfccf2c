"""A report section that is one captioned table, rendered for report.md and report.html (the reference-answer
and batch-invariance sections)."""

from __future__ import annotations

from html import escape

from qa.textfmt import md_cell


def markdown_table_section(title: str, caption: str, headers: tuple[str, ...], body: list[list[str]]) -> list[str]:
    """report.md lines: the heading, the caption and the table (none when `body` is empty)."""
    if not body:
        return []
    lines = ["", f"## {title}", "", md_cell(caption), ""]
    lines.append("| " + " | ".join(headers) + " |")
    lines.append("|" + "---|" * len(headers))
    return lines + ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in body]


def html_table_section(title: str, caption: str, headers: tuple[str, ...], body: list[list[str]]) -> str:
    """report.html fragment: the heading, the caption and the table ('' when `body` is empty)."""
    if not body:
        return ""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    rows = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in body)
    return (f"<h2>{escape(title)}</h2><p>{escape(caption)}</p>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
