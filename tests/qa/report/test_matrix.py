"""qa.report.matrix: the run-level report of the committed several-candidate run re-renders to its committed
report.md byte for byte, and its report.html holds the same tables and links with no script."""

from __future__ import annotations

from pathlib import Path

from qa.files.rundir import RunDir
from qa.gate.candidates import run_verdict
from qa.report.document import Document
from qa.report.gather import resolve_verdict
from qa.report.html import render_html
from qa.report.markdown import render_markdown
from qa.report.matrix import matrix_document
from qa.steps import several

RUN = Path(__file__).resolve().parents[3] / "reports" / "sequential" / "items_to_verdict"


def _document() -> Document:
    rd = RunDir(RUN)
    verdicts = {}
    for name in several(RUN):
        crd = rd.candidate(name)
        verdicts[name], _ = resolve_verdict(crd, crd.load_comparison(), None)
    folders = {n: rd.candidate(n).root.relative_to(rd.root).as_posix() for n in verdicts}
    return matrix_document(run_verdict(verdicts, folders), verdicts)


def test_the_committed_matrix_report_re_renders_byte_for_byte() -> None:
    assert render_markdown(_document(), {}) == (RUN / "report.md").read_text(encoding="utf-8")


def test_the_matrix_page_has_the_same_tables_and_links() -> None:
    page = render_html(_document())
    assert page.split("<body>", 1)[1].startswith('<header class="banner fail" id="verdict"><h1>FAIL</h1>')
    assert "<h2>Candidate x task</h2>" in page and "<h2>Delta (candidate - baseline, points)</h2>" in page
    assert '<a href="candidates/reference/report.md">reference</a>' in page
    assert '<a href="candidates/aa/report.html">report.html</a>' in page
    assert '<td class="num">-19.8 pts</td>' in page and "<script" not in page


def test_the_matrix_shows_each_candidates_kv_bytes_per_token_when_known() -> None:
    rd = RunDir(RUN)
    verdicts = {}
    for name in several(RUN):
        crd = rd.candidate(name)
        verdicts[name], _ = resolve_verdict(crd, crd.load_comparison(), None)
    folders = {n: rd.candidate(n).root.relative_to(rd.root).as_posix() for n in verdicts}
    run = run_verdict(verdicts, folders)
    first = run.candidates[0].name
    md = render_markdown(matrix_document(run, verdicts, {first: (6480, 23040)}), {})
    assert "| candidate | verdict | KV bytes/token |" in md
    assert "| 6480 (28%) |" in md and md.count("| \\- |") == len(run.candidates) - 1  # the others: not known
