"""A report as data: a banner, then sections of paragraphs, call-outs, lists, tables, figures and
preformatted text, built once (qa.report.build, qa.report.matrix) and rendered by `qa.report.markdown`
and `qa.report.html`. Every string here is plain text, escaped by the renderer."""

from __future__ import annotations

from dataclasses import dataclass

from qa.files.verdict import Status


@dataclass(frozen=True)
class Text:
    """Plain text."""

    text: str


@dataclass(frozen=True)
class Strong:
    """Emphasised text (bold)."""

    text: str


@dataclass(frozen=True)
class Code:
    """An identifier or a log line, shown as code."""

    text: str


@dataclass(frozen=True)
class Link:
    """A link to a file of the report's folder (`href` is a relative path the toolkit wrote)."""

    text: str
    href: str


@dataclass(frozen=True)
class StatusMark:
    """A verdict status: a mark and the word in Markdown, a coloured pill in HTML."""

    status: Status


@dataclass(frozen=True)
class Verbatim:
    """Model output shown as it came (a completion): one folded line in Markdown, a <pre> block in HTML."""

    text: str


Inline = Text | Strong | Code | Link | StatusMark | Verbatim
Line = tuple[Inline, ...]


def line(*parts: Inline | str) -> Line:
    """A line of inline parts; a str is plain `Text`."""
    return tuple(Text(p) if isinstance(p, str) else p for p in parts)


@dataclass(frozen=True)
class Cell:
    """One table cell as plain text: a main value and an optional smaller second line. `strong` emphasises
    the main value, `status` draws it as the verdict's pill in HTML (Markdown shows `main`), `link` makes it
    a link to a file of the report's folder."""

    main: str
    sub: str = ""
    strong: bool = False
    status: Status | None = None
    link: str | None = None


@dataclass(frozen=True)
class Table:
    """A table; `num_cols`: the columns right-aligned in HTML (0-based)."""

    headers: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]
    num_cols: frozenset[int] = frozenset()


def table(headers: tuple[str, ...] | list[str], rows: list[list[str]] | list[list[Cell]],
          num_cols: frozenset[int] = frozenset()) -> Table:
    """A Table of plain-text (str) or Cell rows."""
    return Table(tuple(headers), tuple(tuple(c if isinstance(c, Cell) else Cell(c) for c in r) for r in rows),
                 num_cols)


@dataclass(frozen=True)
class Paragraph:
    """One paragraph."""

    text: Line


@dataclass(frozen=True)
class Callout:
    """A highlighted note: a bold title and its text."""

    title: str
    text: str


@dataclass(frozen=True)
class Item:
    """A list item and its nested items (warnings, completions)."""

    text: Line
    sub: tuple[Line, ...] = ()


@dataclass(frozen=True)
class Bullets:
    """A bulleted list."""

    items: tuple[Item, ...]


def bullets(lines: list[Line] | list[str]) -> Bullets:
    """Bullets of one line each (a str is plain text)."""
    return Bullets(tuple(Item(line(x) if isinstance(x, str) else x) for x in lines))


@dataclass(frozen=True)
class Figure:
    """A PNG figure: `name` is its file stem under plots/, `title` its caption, `alt` what it shows."""

    name: str
    title: str
    alt: str
    png: bytes


@dataclass(frozen=True)
class Preformatted:
    """Text shown with its line breaks and indentation (a spec file)."""

    text: str


@dataclass(frozen=True)
class Section:
    """A titled section; a Section inside another is a subsection."""

    title: str
    blocks: tuple[Block, ...]


Block = Paragraph | Callout | Bullets | Table | Figure | Preformatted | Section


@dataclass(frozen=True)
class Banner:
    """The verdict first: its status, a one-line summary and what was compared under which policy."""

    status: Status
    summary: str
    subtitle: Line


@dataclass(frozen=True)
class Document:
    """One report: the banner, then its sections in order; `title` names the HTML page."""

    title: str
    banner: Banner
    sections: tuple[Section, ...]
