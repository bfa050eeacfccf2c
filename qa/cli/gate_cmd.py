"""`qa gate RUN_DIR` and `qa report RUN_DIR`: thin shells over `qa.api.gate` and `qa.api.report`.

gate exits 0 pass, 1 fail, 3 inconclusive (2: usage or input error, printed as one line).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from qa import api
from qa.cli.app import app
from qa.cli.options import PolicyOpt, RunDirArg
from qa.cli.run_cmd import print_matrix
from qa.errors import QAError
from qa.gate.junit import write_junit
from qa.gate.summary import write_summary
from qa.files.verdict import Verdict
from qa.textfmt import pts

STYLE = {"pass": "bold green", "fail": "bold red", "inconclusive": "bold yellow"}


def print_verdict(verdict: Verdict) -> None:
    """The per-task table, the warnings and the summary line."""
    console = Console() if Console().is_terminal else Console(width=160)
    t = Table(title=f"{verdict.candidate} vs {verdict.baseline} (delta = candidate - baseline)")
    for col in ("task", "metric", "status", "n", "delta", "reason"):
        t.add_column(col, overflow="fold")
    for v in verdict.tasks:
        t.add_row(v.task, v.metric, f"[{STYLE[v.status]}]{v.status}[/]", str(v.n), pts(v.delta), v.reason)
    console.print(t)
    for v in verdict.tasks:
        for w in v.warnings:
            console.print(f"[yellow]warning[/] {v.task}: {w}", markup=True, highlight=False)
    console.print(f"[{STYLE[verdict.status]}]{verdict.summary}[/]")


@app.command()
def gate(
    run_dir: RunDirArg,
    policy: PolicyOpt = None,
    junit: Annotated[Path | None, typer.Option("--junit", help="Also write JUnit XML here (one testcase per task).")] = None,
    summary: Annotated[
        Path | None, typer.Option("--summary", help="Also write Markdown for a CI step summary (appends to an existing file).")
    ] = None,
) -> None:
    """Decide pass / fail / inconclusive per task under a policy; write verdict.json. Exit 0 / 1 / 3
    (a run with several candidates: each in candidates/<name>/, then the run's; 0 only if all pass)."""
    if api.candidate_names(run_dir) is not None:
        run_verdict, verdicts = api.gate_candidates(run_dir, policy)
        if junit is not None:
            write_junit(junit, list(verdicts.values()))
        if summary is not None:
            write_summary(summary, (run_verdict, list(verdicts.values())))
        for v in verdicts.values():
            print_verdict(v)
        print_matrix(run_verdict)
        print(run_verdict.summary)
        print(f"wrote {run_dir / 'verdict.json'} (and candidates/<name>/verdict.json, junit.xml, summary.md)")
        raise typer.Exit(run_verdict.exit_code)
    verdict = api.gate(run_dir, policy)
    if junit is not None:
        write_junit(junit, verdict)
    if summary is not None:
        write_summary(summary, verdict)
    print_verdict(verdict)
    print(f"wrote {run_dir / 'verdict.json'}")
    raise typer.Exit(verdict.exit_code)


@app.command()
def report(
    run_dir: RunDirArg,
    policy: Annotated[
        Path | None,
        typer.Option("--policy", help="Re-gate under this policy for the report; default: verdict.json (or the shipped default)."),
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Folder for report.md, report.html, plots/ (default: RUN_DIR).")] = None,
) -> None:
    """Write report.md and a self-contained report.html (verdict, per-task table, plots, provenance); for
    a run with several candidates, each candidate's and the run's candidate x task matrix."""
    if api.candidate_names(run_dir) is not None:
        if out is not None:
            raise QAError("--out: a run with several candidates writes its reports into the run directory")
        md, page = api.report_candidates(run_dir, policy)
        print(f"wrote {page} and candidates/<name>/report.html")
        print(f"wrote {md}")
        return
    paths = api.report(run_dir, policy, out)
    print(f"wrote {paths.html}")
    print(f"wrote {paths.markdown}")
