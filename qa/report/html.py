"""report.html: a `Document` as one self-contained page (figures as data URIs, inline CSS) whose
Content-Security-Policy allows no script at all; every datum that came from a model, a dataset or a file is
HTML-escaped."""

from __future__ import annotations

import base64
import html

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

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1f2328;background:#fff}
main{max-width:1320px;margin:0 auto;padding:0 24px 48px}
.banner{padding:28px 24px;color:#fff;margin-bottom:20px}
.banner h1{font-size:64px;line-height:1;margin:0 0 10px;letter-spacing:2px}
.banner p{font-size:20px;margin:4px 0}.banner .sub{font-size:14px;opacity:.9}
.pass{background:#1a7f37}.fail{background:#cf222e}.inconclusive{background:#9a6700}
.pill{display:inline-block;padding:1px 8px;border-radius:10px;color:#fff;font-weight:600;font-size:12px}
h2{border-bottom:1px solid #d0d7de;padding-bottom:4px;margin-top:32px}
table{border-collapse:collapse;font-size:12.5px;width:100%}
th,td{border:1px solid #d0d7de;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#f6f8fa}small{color:#57606a}.scroll{overflow-x:auto}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.callout{border-left:6px solid #9a6700;background:#fff8c5;padding:10px 14px;margin:12px 0}
pre{background:#f6f8fa;padding:8px;overflow-x:auto;white-space:pre-wrap;word-break:break-word;font-size:12px}
img{max-width:100%}
li{margin:4px 0}
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _pill(status: str) -> str:
    return f'<span class="pill {_e(status)}">{_e(status.upper())}</span>'


def _inline(part: Inline) -> str:
    if isinstance(part, Strong):
        return f"<b>{_e(part.text)}</b>"
    if isinstance(part, Code):
        return f"<code>{_e(part.text)}</code>"
    if isinstance(part, Link):
        return f'<a href="{_e(part.href)}">{_e(part.text)}</a>'
    if isinstance(part, StatusMark):
        return _pill(part.status)
    if isinstance(part, Verbatim):
        return f"<pre>{_e(part.text)}</pre>"
    assert isinstance(part, Text)
    return _e(part.text)


def _line(parts: Line) -> str:
    return "".join(_inline(p) for p in parts)


def _cell(cell: Cell, num: bool) -> str:
    main = _pill(cell.status) if cell.status is not None else _e(cell.main)
    if cell.strong:
        main = f"<b>{main}</b>"
    if cell.link is not None:
        main = f'<a href="{_e(cell.link)}">{main}</a>'
    sub = f"<br><small>{_e(cell.sub)}</small>" if cell.sub else ""
    return f'<td class="num">{main}{sub}</td>' if num else f"<td>{main}{sub}</td>"


def html_table(t: Table) -> str:
    """A table in a horizontally scrolling box; the `num_cols` columns right-aligned."""
    head = "".join(f"<th>{_e(h)}</th>" for h in t.headers)
    body = "".join("<tr>" + "".join(_cell(c, i in t.num_cols) for i, c in enumerate(r)) + "</tr>" for r in t.rows)
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _img(fig: Figure) -> str:
    return f'<img alt="{_e(fig.alt)}" src="data:image/png;base64,{base64.b64encode(fig.png).decode("ascii")}">'


def _block(b: Block, depth: int) -> str:
    if isinstance(b, Section):
        return f"<h{depth}>{_e(b.title)}</h{depth}>" + "".join(_block(x, depth + 1) for x in b.blocks)
    if isinstance(b, Paragraph):
        return f"<p>{_line(b.text)}</p>"
    if isinstance(b, Callout):
        return f'<div class="callout"><b>{_e(b.title)}</b> {_e(b.text)}</div>'
    if isinstance(b, Bullets):
        items = []
        for item in b.items:
            sub = "<ul>" + "".join(f"<li>{_line(s)}</li>" for s in item.sub) + "</ul>" if item.sub else ""
            items.append(f"<li>{_line(item.text)}{sub}</li>")
        return "<ul>" + "".join(items) + "</ul>"
    if isinstance(b, Table):
        return html_table(b)
    if isinstance(b, Figure):
        return _img(b)
    assert isinstance(b, Preformatted)
    return f"<pre>{_e(b.text)}</pre>"


def render_html(doc: Document) -> str:
    """report.html of `doc`: one self-contained page, figures as data URIs, no script, every datum escaped."""
    b = doc.banner
    parts = [
        f'<header class="banner {_e(b.status)}" id="verdict"><h1>{_e(b.status.upper())}</h1>',
        f"<p>{_e(b.summary)}</p>",
        f'<p class="sub">{_line(b.subtitle)}</p></header><main>',
        *(_block(s, 2) for s in doc.sections),
        "</main>",
    ]
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(doc.title)}</title><style>{CSS}</style></head><body>"
        + "\n".join(parts)
        + "</body></html>\n"
    )
