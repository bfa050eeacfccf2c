"""The report's "Reference-answer signal" table: each task's numbers and decision, "not available"."""

from __future__ import annotations

from pathlib import Path

from qa.files.comparison import ReferenceEstimate, save_comparison
from qa.files.policy import default_policy
from qa.files.rundir import RunDir
from qa.report.build import build_document
from qa.report.figures import Figures
from qa.report.gather import gather
from qa.report.html import render_html
from qa.report.markdown import render_markdown
from tests.qa.gate.test_reference import comparison, ref


def test_report_table_shows_each_task_and_not_available(tmp_path: Path) -> None:
    na = ReferenceEstimate(task="needle", n=0, n_clusters=0, n_tokens=0, n_missing=4, unavailable="not available: x")
    comp = comparison(ref("gsm8k", -0.0123, 0.0456), na)
    save_comparison(RunDir(tmp_path).comparison, comp)
    inp = gather(tmp_path, default_policy())
    doc = build_document(inp, Figures(forest=None, flips=None, kl=(), kv=None))
    md = render_markdown(doc, {})
    assert "## Reference-answer signal" in md
    assert "| gsm8k | 20 (1000 tokens) | \\-0.0123 [-0.0165, -0.0081] | 0.0456 [0.0414, 0.0498] |" in md  # md-escaped
    assert "pass (decides)" in md
    assert "| needle | 0 | not available | not available |" in md
    page = render_html(doc)
    assert "<h2>Reference-answer signal</h2>" in page and "not available" in page
