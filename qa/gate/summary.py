"""Markdown for a CI step summary (e.g. $GITHUB_STEP_SUMMARY): the verdict line and a row per task; for a
several-candidate run, the run's line, a candidate x task matrix, then each candidate's own summary."""

from __future__ import annotations

from pathlib import Path

from qa.files.verdict import RunVerdict, Verdict
from qa.textfmt import md_cell, pts
from quant.fileio import atomic_write_text

STATUS_MARK = {"pass": "✅ PASS", "fail": "❌ FAIL", "inconclusive": "⚠️ INCONCLUSIVE"}


def summary_markdown(verdict: Verdict) -> str:
    """The verdict line, then one row per task, then the warnings."""
    lines = [
        f"## {STATUS_MARK[verdict.status]}: {md_cell(verdict.candidate)} vs {md_cell(verdict.baseline)}",
        "",
        md_cell(verdict.summary),
        "",
        "| task | metric | status | n | delta | CI | margin | reason |",
        "|---|---|---|---:|---:|---|---:|---|",
    ]
    for t in verdict.tasks:
        ni = next((r for r in t.rules if r.ci is not None), None)
        ci = "-"
        if ni is not None and ni.ci is not None:
            level = f"{round(100 * ni.ci_level)}% " if ni.ci_level is not None else ""
            ci = f"{level}[{100 * ni.ci.lower:+.1f}, {100 * ni.ci.upper:+.1f}]"
        lines.append(f"| {md_cell(t.task)} | {md_cell(t.metric)} | {STATUS_MARK[t.status]} | {t.n} | {pts(t.delta)} | "
                     f"{ci} | {100 * t.margin:.1f} pts | {md_cell(t.reason)} |")
    warns = [(t.task, w) for t in verdict.tasks for w in t.warnings]
    if warns:
        lines += ["", "**Warnings**", ""] + [f"- {md_cell(task)}: {md_cell(w)}" for task, w in warns]
    footer = f"_{md_cell(verdict.sign_convention)}; policy {md_cell(verdict.policy.name)} ({verdict.policy_sha256[:12]})_"
    lines += ["", footer, ""]
    return "\n".join(lines)


def matrix_tasks(run: RunVerdict) -> list[str]:
    """Every task of any candidate, in first-seen order: the matrix's columns."""
    return list(dict.fromkeys(t for c in run.candidates for t in c.tasks))


def matrix_markdown(run: RunVerdict, links: dict[str, str] | None = None) -> list[str]:
    """The candidate x task matrix as Markdown table lines (a candidate's name linked when `links` has it)."""
    tasks = matrix_tasks(run)
    lines = ["| candidate | verdict | " + " | ".join(md_cell(t) for t in tasks) + " |",
             "|---|---|" + "---|" * len(tasks)]
    for c in run.candidates:
        name = md_cell(c.name)
        if links and c.name in links:
            name = f"[{name}]({links[c.name]})"
        cells = [STATUS_MARK[c.tasks[t]] if t in c.tasks else "-" for t in tasks]
        lines.append(f"| {name} | {STATUS_MARK[c.status]} | " + " | ".join(cells) + " |")
    return lines


def run_summary_markdown(run: RunVerdict, verdicts: list[Verdict]) -> str:
    """The run's verdict line, the candidate x task matrix, then each candidate's own summary."""
    lines = [f"## {STATUS_MARK[run.status]}: {len(run.candidates)} candidates vs {md_cell(run.baseline)}", "",
             md_cell(run.summary), ""] + matrix_markdown(run) + [""]
    return "\n".join(lines) + "\n" + "\n".join("#" + summary_markdown(v) for v in verdicts)  # "### " headings


def write_summary(path: Path, verdict: Verdict | tuple[RunVerdict, list[Verdict]]) -> None:
    """Write the step-summary Markdown atomically; an existing file (GITHUB_STEP_SUMMARY) is appended to.
    `verdict` is one candidate's, or a several-candidate run's (run verdict, candidate verdicts)."""
    text = summary_markdown(verdict) if isinstance(verdict, Verdict) else run_summary_markdown(*verdict)
    if path.exists() and path.stat().st_size > 0:
        text = path.read_text(encoding="utf-8") + "\n" + text
    atomic_write_text(path, text)
