"""`qa gate RUN_DIR` and `qa report RUN_DIR`: thin shells over `qa.gate.gate_run` and `qa.report.render`.

gate exits 0 pass, 1 fail, 3 inconclusive (2: usage or input error, printed as one line).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from qa.app import app
from qa.errors import QAError
from qa.gate import Verdict, gate_run, pts, write_junit, write_summary
from qa.policy import Policy, load_policy, resolve_policy
from qa.report import render

RunDirArg = Annotated[
    Path, typer.Argument(help="Run directory holding comparison.json (from `qa run` or `qa compare`).")
]
PolicyOpt = Annotated[
    Path | None,
    typer.Option(
        "--policy", help="Gate policy TOML; default: the run's spec.toml policy, else the shipped default."
    ),
]
_STYLE = {"pass": "bold green", "fail": "bold red", "inconclusive": "bold yellow"}


def policy_for_run(run_dir: Path, policy: Path | None) -> Policy:
    """--policy when given; else the policy named in the run's spec.toml; else the shipped default."""
    if policy is not None:
        return load_policy(policy)
    spec = run_dir / "spec.toml"
    if spec.is_file():
        try:
            ref = tomllib.loads(spec.read_text(encoding="utf-8")).get("policy")
        except tomllib.TOMLDecodeError as exc:
            raise QAError(f"{spec}: not valid TOML ({exc}); pass --policy explicitly") from None
        if isinstance(ref, str):
            return resolve_policy(ref, relative_to=run_dir)
    return resolve_policy(None)


def _table(verdict: Verdict) -> Table:
    t = Table(title=f"{verdict.candidate} vs {verdict.baseline} (delta = candidate - baseline)")
    for col in ("task", "metric", "status", "n", "delta", "reason"):
        t.add_column(col, overflow="fold")
    for v in verdict.tasks:
        t.add_row(v.task, v.metric, f"[{_STYLE[v.status]}]{v.status}[/]", str(v.n), pts(v.delta), v.reason)
    return t


def _print(verdict: Verdict) -> None:
    console = Console() if Console().is_terminal else Console(width=160)
    console.print(_table(verdict))
    for v in verdict.tasks:
        for w in v.warnings:
            console.print(f"[yellow]warning[/] {v.task}: {w}", markup=True, highlight=False)
    console.print(f"[{_STYLE[verdict.status]}]{verdict.summary}[/]")


@app.command()
def gate(
    run_dir: RunDirArg,
    policy: PolicyOpt = None,
    junit: Annotated[
        Path | None, typer.Option("--junit", help="Also write JUnit XML here (one testcase per task).")
    ] = None,
    summary: Annotated[
        Path | None,
        typer.Option(
            "--summary", help="Also write Markdown for a CI step summary (appends to an existing file)."
        ),
    ] = None,
) -> None:
    """Decide pass / fail / inconclusive per task under a policy; write verdict.json. Exit 0 / 1 / 3."""
    if not run_dir.is_dir():
        raise QAError(f"{run_dir}: no such run directory")
    verdict = gate_run(run_dir, policy_for_run(run_dir, policy))
    if junit is not None:
        write_junit(junit, verdict)
    if summary is not None:
        write_summary(summary, verdict)
    _print(verdict)
    print(f"wrote {run_dir / 'verdict.json'}")
    raise typer.Exit(verdict.exit_code)


@app.command()
def report(
    run_dir: RunDirArg,
    policy: Annotated[
        Path | None,
        typer.Option(
            "--policy",
            help="Re-gate under this policy for the report; default: verdict.json (or the shipped default).",
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Folder for report.md, report.html, plots/ (default: RUN_DIR)."),
    ] = None,
) -> None:
    """Write report.md and a self-contained report.html (verdict, per-task table, plots, provenance)."""
    paths = render(run_dir, load_policy(policy) if policy is not None else None, out)
    print(f"wrote {paths.html}")
    print(f"wrote {paths.markdown}")
