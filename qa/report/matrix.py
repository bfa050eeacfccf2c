"""The run-level report of a several-candidate run: report.md and report.html at the run root with the
run's verdict, a candidate x task matrix (status and delta per cell) and a link to each candidate's own
report in candidates/<name>/. Every datum is escaped as in the per-candidate reports."""

from __future__ import annotations

import html
from pathlib import Path

from qa.files.rundir import RunDir
from qa.files.verdict import RunVerdict, Verdict
from qa.gate.summary import STATUS_MARK, matrix_markdown, matrix_tasks
from qa.report.html import CSP, CSS, html_table
from qa.textfmt import md_cell, pts
from quant.fileio import atomic_write_text


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _delta(verdict: Verdict | None, task: str) -> str:
    tv = next((t for t in verdict.tasks if t.task == task), None) if verdict is not None else None
    return "" if tv is None or tv.delta is None else pts(tv.delta)


def matrix_markdown_report(run: RunVerdict, verdicts: dict[str, Verdict]) -> str:
    """report.md of a several-candidate run: verdict, matrix, one line per candidate with its report."""
    links = {c.name: f"{c.folder}/report.md" for c in run.candidates}
    lines = [f"# {STATUS_MARK[run.status]}", "", f"**{md_cell(run.summary)}**", "",
             (f"Each candidate is compared with baseline `{md_cell(run.baseline)}` on the same items and gated on "
             f"its own; policy {md_cell(run.policy_name)} ({run.policy_sha256[:12]})."), "",
             "## Candidate x task", ""] + matrix_markdown(run, links)
    tasks = matrix_tasks(run)
    lines += ["", "## Delta (candidate - baseline, points)", "",
              "| candidate | " + " | ".join(md_cell(t) for t in tasks) + " |", "|---|" + "---|" * len(tasks)]
    for c in run.candidates:
        lines.append(f"| {md_cell(c.name)} | " + " | ".join(md_cell(_delta(verdicts.get(c.name), t)) or "-"
                                                          for t in tasks) + " |")
    lines += ["", "## Candidates", ""]
    for c in run.candidates:
        lines.append(f"- {STATUS_MARK[c.status]} **{md_cell(c.name)}**: {md_cell(c.summary)} "
                     f"([report.md]({c.folder}/report.md), [report.html]({c.folder}/report.html))")
        lines += [f"  - {md_cell(t)}: {md_cell(r)}" for t, r in c.reasons.items()]
    return "\n".join(lines) + "\n"


def _pill(status: str) -> str:
    return f'<span class="pill {_e(status)}">{_e(status.upper())}</span>'


def matrix_html_report(run: RunVerdict, verdicts: dict[str, Verdict]) -> str:
    """report.html of a several-candidate run (self-contained, no script)."""
    tasks = matrix_tasks(run)
    rows = []
    for c in run.candidates:
        cells = [f'<a href="{_e(c.folder)}/report.html"><b>{_e(c.name)}</b></a>', _pill(c.status)]
        for t in tasks:
            status = c.tasks.get(t)
            if status is None:
                cells.append("-")
                continue
            delta = _delta(verdicts.get(c.name), t)
            cells.append(_pill(status) + (f"<br><small>{_e(delta)}</small>" if delta else "")
                         + f'<br><small title="{_e(c.reasons.get(t, ""))}">{_e(c.reasons.get(t, ""))}</small>')
        rows.append(cells)
    body = [
        (f'<div class="banner {_e(run.status)}"><h1>{_e(run.status.upper())}</h1><p>{_e(run.summary)}</p>'
        f'<p class="sub">baseline {_e(run.baseline)}; policy {_e(run.policy_name)} ({_e(run.policy_sha256[:12])})</p>'
        "</div><main>"),
        ("<h2>Candidate x task</h2><p>Each candidate is compared with the baseline on the same items (paired) "
        "and gated on its own; the run passes only when every candidate passes. Cells: status, delta "
        "(candidate - baseline), reason.</p>"),
        '<div class="scroll">', html_table(["candidate", "verdict", *tasks], rows, frozenset()), "</div>",
        "<h2>Candidates</h2><ul>",
    ]
    body += [f'<li>{_pill(c.status)} <a href="{_e(c.folder)}/report.html">{_e(c.name)}</a>: {_e(c.summary)}</li>'
             for c in run.candidates]
    body.append("</ul></main>")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f"<title>{_e(run.status.upper())}: {len(run.candidates)} candidates</title><style>{CSS}</style></head>"
            f"<body>{''.join(body)}</body></html>\n")


def render_matrix(run_dir: Path, run: RunVerdict, verdicts: dict[str, Verdict]) -> tuple[Path, Path]:
    """Write report.md and report.html of a several-candidate run at its root; their paths."""
    rd = RunDir(run_dir)
    atomic_write_text(rd.report_md, matrix_markdown_report(run, verdicts))
    atomic_write_text(rd.report_html, matrix_html_report(run, verdicts))
    return rd.report_md, rd.report_html
