"""Verdict tables the commands print (gate, run): one place for how a verdict looks on a terminal."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from qa.files.verdict import RunVerdict, Verdict
from qa.textfmt import pts


def console() -> Console:
    """A console for tables: the terminal's width, or 160 columns in pipes and logs (no wrapping)."""
    return Console() if Console().is_terminal else Console(width=160)


STYLE = {"pass": "bold green", "fail": "bold red", "inconclusive": "bold yellow"}


def print_verdict(verdict: Verdict) -> None:
    """The per-task table, the warnings and the summary line."""
    out = console()
    t = Table(title=f"{verdict.candidate} vs {verdict.baseline} (delta = candidate - baseline)")
    for col in ("task", "metric", "status", "n", "delta", "reason"):
        t.add_column(col, overflow="fold")
    for v in verdict.tasks:
        t.add_row(v.task, v.metric, f"[{STYLE[v.status]}]{v.status}[/]", str(v.n), pts(v.delta), v.reason)
    out.print(t)
    for v in verdict.tasks:
        for w in v.warnings:
            out.print(f"[yellow]warning[/] {v.task}: {w}", markup=True, highlight=False)
    out.print(f"[{STYLE[verdict.status]}]{verdict.summary}[/]")


def print_matrix(verdict: RunVerdict) -> None:
    """The candidate x task status matrix of a several-candidate run."""
    tasks = list(dict.fromkeys(t for c in verdict.candidates for t in c.tasks))
    table = Table("candidate", "verdict", *tasks, title=f"each candidate vs {verdict.baseline}")
    for c in verdict.candidates:
        table.add_row(c.name, c.status, *(c.tasks.get(t, "-") for t in tasks))
    console().print(table)


