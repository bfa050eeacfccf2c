"""report.md: a `Document` in Markdown, figures linked as files; every datum passes through
`qa.textfmt.md_cell` (HTML-escaped, Markdown syntax backslash-escaped)."""

from __future__ import annotations

import html
import re

from qa.gate.summary import STATUS_MARK
from qa.report.document import (
    Block,
    Bullets,
    Callout,
    Cell,
    Code,
    Document,
    Figure,
    Inline,
    Line,
    Link,
    Paragraph,
    Preformatted,
    Section,
    StatusMark,
    Strong,
    Table,
    Text,
    Verbatim,
)
from qa.textfmt import md_cell


def _inline(part: Inline) -> str:
    if isinstance(part, Strong):
        return f"**{md_cell(part.text)}**"
    if isinstance(part, Code):
        return f"`{md_cell(part.text)}`"
    if isinstance(part, Link):
        return f"[{md_cell(part.text)}]({part.href})"
    if isinstance(part, StatusMark):
        return STATUS_MARK[part.status]
    assert isinstance(part, Text | Verbatim)
    return md_cell(part.text)


def _line(parts: Line) -> str:
    return "".join(_inline(p) for p in parts)


def _cell(cell: Cell) -> str:
    main = f"[{md_cell(cell.main)}]({cell.link})" if cell.link is not None else md_cell(cell.main)
    return main + (f"<br>{md_cell(cell.sub)}" if cell.sub else "")


def md_table(t: Table) -> list[str]:
    """A Markdown table: the header row, the separator and one line per row."""
    out = ["| " + " | ".join(md_cell(h) for h in t.headers) + " |", "|" + "---|" * len(t.headers)]
    return out + ["| " + " | ".join(_cell(c) for c in r) + " |" for r in t.rows]


def _fence(text: str) -> str:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _block(b: Block, figure_files: dict[str, str], depth: int) -> list[str]:
    if isinstance(b, Section):
        lines = [f"{'#' * depth} {md_cell(b.title)}"]
        for inner in b.blocks:
            lines += ["", *_block(inner, figure_files, depth + 1)]
        return lines
    if isinstance(b, Paragraph):
        return [_line(b.text)]
    if isinstance(b, Callout):
        return [f"> **{md_cell(b.title)}** {md_cell(b.text)}"]
    if isinstance(b, Bullets):
        out = []
        for item in b.items:
            out += [f"- {_line(item.text)}"] + [f"  - {_line(s)}" for s in item.sub]
        return out
    if isinstance(b, Table):
        return md_table(b)
    if isinstance(b, Figure):
        return [f"![{md_cell(b.title)}]({figure_files[b.name]})"]
    assert isinstance(b, Preformatted)
    fence = _fence(b.text)  # a code block: HTML-escaped, so no tag in the file can ever render
    return [fence, html.escape(b.text, quote=False), fence]


def render_markdown(doc: Document, figure_files: dict[str, str]) -> str:
    """report.md of `doc`; `figure_files` maps each figure's name to its path relative to report.md."""
    b = doc.banner
    lines = [f"# {STATUS_MARK[b.status]}", "", f"**{md_cell(b.summary)}**", "", _line(b.subtitle)]
    for section in doc.sections:
        lines += ["", *_block(section, figure_files, 2)]
    return "\n".join(lines) + "\n"
