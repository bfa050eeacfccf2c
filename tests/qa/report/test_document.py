"""qa.report.document rendered by qa.report.markdown and qa.report.html: one hand-made Document, its exact
report.md, and the same content in report.html with every datum escaped and no script."""

from __future__ import annotations

from html.parser import HTMLParser

from qa.report.document import (
    Banner,
    Callout,
    Cell,
    Code,
    Document,
    Figure,
    Link,
    Paragraph,
    Preformatted,
    Section,
    StatusMark,
    Strong,
    Verbatim,
    bullets,
    line,
    table,
)
from qa.report.html import render_html
from qa.report.markdown import render_markdown

PNG = b"\x89PNG\r\n\x1a\n"  # the magic number stands in for a figure's bytes
HOSTILE = "<script>alert(1)</script> *x* | -y"


def _doc() -> Document:
    rows = table(["task", "verdict", "n"], [[Cell("gsm8k", "exact_match", strong=True), Cell("PASS", status="pass"),
                                              Cell("-")], [Cell(HOSTILE), Cell("FAIL", status="fail"), Cell("3")]],
                 frozenset({2}))
    return Document(
        "PASS: c vs b",
        Banner("pass", "PASS: all 1 task(s) pass", line("candidate ", Code("c"), "; policy ", HOSTILE)),
        (
            Section("Verdict per task", (
                bullets([line(StatusMark("pass"), " ", Strong("gsm8k"), ": fine")]),
                Callout("Truncated outputs.", HOSTILE),
            )),
            Section("Results", (rows, Paragraph(line("Chance: ", "<0.01%", ".")))),
            Section("Forest plot of delta", (Figure("forest", "Forest plot of delta", "forest plot", PNG),)),
            Section("Changed answers", (
                Section("a task", (bullets([line(Link("report.md", "candidates/a/report.md"))]),)),
                bullets([]),
            )),
            Section("Provenance", (
                bullets(["k: v"]),
                Section("spec.toml", (Preformatted('model = "```<b>"\n  x = 1'),)),
            )),
        ),
    )


def test_markdown_is_exact_and_escaped() -> None:
    md = render_markdown(_doc(), {"forest": "plots/forest.png"})
    want = [
        "# ✅ PASS", "", "**PASS: all 1 task(s) pass**", "",
        r"candidate `c`; policy &lt;script&gt;alert(1)&lt;/script&gt; \*x\* \| -y",
        "", "## Verdict per task", "", "- ✅ PASS **gsm8k**: fine", "",
        r"> **Truncated outputs.** &lt;script&gt;alert(1)&lt;/script&gt; \*x\* \| -y",
        "", "## Results", "", "| task | verdict | n |", "|---|---|---|",
        r"| gsm8k<br>exact_match | PASS | \- |",
        r"| &lt;script&gt;alert(1)&lt;/script&gt; \*x\* \| -y | FAIL | 3 |",
        "", "Chance: &lt;0.01%.",
        "", "## Forest plot of delta", "", "![Forest plot of delta](plots/forest.png)",
        "", "## Changed answers", "", "### a task", "", "- [report.md](candidates/a/report.md)", "",
        "", "## Provenance", "", "- k: v", "", "### spec.toml", "", "````", 'model = "```&lt;b&gt;"', "  x = 1",
        "````", "",
    ]
    assert md.split("\n") == want


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_html_has_the_same_content_escaped() -> None:
    page = render_html(_doc())
    parser = _Collector()
    parser.feed(page)
    assert "script" not in parser.tags and "<script" not in page
    text = "".join(parser.text)
    assert text.count(HOSTILE) == 3  # banner, call-out and table cell: shown as text
    assert page.split("<body>", 1)[1].startswith('<header class="banner pass" id="verdict"><h1>PASS</h1>')
    assert '<td class="num">3</td>' in page and '<span class="pill fail">FAIL</span>' in page
    assert "<td><b>gsm8k</b><br><small>exact_match</small></td>" in page
    assert '<img alt="forest plot" src="data:image/png;base64,iVBORw0KGgo=">' in page
    assert "<h3>a task</h3>" in page and '<a href="candidates/a/report.md">report.md</a>' in page
    assert "<pre>model = &quot;```&lt;b&gt;&quot;\n  x = 1</pre>" in page


def test_verbatim_is_one_line_in_markdown_and_a_block_in_html() -> None:
    doc = Document("t", Banner("fail", "s", line("x")),
                   (Section("Changed answers", (bullets([line("baseline completion: ", Verbatim("a\nb `c`"))]),)),))
    assert "- baseline completion: a b \\`c\\`\n" in render_markdown(doc, {})
    assert "<li>baseline completion: <pre>a\nb `c`</pre></li>" in render_html(doc)
