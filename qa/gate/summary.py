"""Markdown for a CI step summary (e.g. $GITHUB_STEP_SUMMARY): the verdict line and a row per task."""

from __future__ import annotations

from pathlib import Path

from qa.gate.verdict import Verdict
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


def write_summary(path: Path, verdict: Verdict) -> None:
    """Write the step-summary Markdown atomically; an existing file (GITHUB_STEP_SUMMARY) is appended to."""
    text = summary_markdown(verdict)
    if path.exists() and path.stat().st_size > 0:
        text = path.read_text(encoding="utf-8") + "\n" + text
    atomic_write_text(path, text)
