"""Render a run directory into report.md and a self-contained report.html (plots inline).

The report is written for a ten-second read: the verdict first, big and coloured, then one row per
task, the forest plot (with the reference-answer intervals of each task they decided), flips, the
per-layer KV-cache error (when the run has kv_inspect.json), the distribution statistics, examples of
changed answers, methods and provenance. Everything that came
from a model, a dataset or a data file is escaped (the page's Content-Security-Policy allows no script
at all); GPQA items are shown by record id only. The report is built once as data (qa.report.document)
and rendered to Markdown and to HTML by one renderer each.

    gather (RunDir -> ReportInputs, verdict resolved) -> figures -> build (one Document) -> markdown / html
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qa.files.policy import Policy
from qa.files.rundir import RunDir
from qa.report.build import build_document
from qa.report.figures import make_figures
from qa.report.gather import gather
from qa.report.html import render_html
from qa.report.markdown import render_markdown
from quant.fileio import atomic_write_bytes, atomic_write_text


@dataclass(frozen=True)
class ReportPaths:
    """The files one render wrote."""

    markdown: Path
    html: Path
    plots: list[Path]


def render(run_dir: Path, policy: Policy | None = None, out_dir: Path | None = None) -> ReportPaths:
    """Write report.md, report.html and plots/*.png for `run_dir` (into `out_dir`, default run_dir),
    re-gated under `policy` when given."""
    out = RunDir(out_dir or run_dir)
    inp = gather(run_dir, policy)
    figs = make_figures(inp)
    doc = build_document(inp, figs)
    written: dict[str, Path] = {}
    for name, png in figs.files().items():
        written[name] = out.plots / f"{name}.png"
        atomic_write_bytes(written[name], png)
    rel = {name: f"{out.plots.name}/{path.name}" for name, path in written.items()}
    atomic_write_text(out.report_md, render_markdown(doc, rel))
    atomic_write_text(out.report_html, render_html(doc))
    return ReportPaths(markdown=out.report_md, html=out.report_html, plots=list(written.values()))
