"""`qa run SPEC.toml`: the whole pipeline (`qa.api.run`), or with --dry-run what it would do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from qa import api
from qa.cli.app import app
from qa.cli.options import DataDirOpt, PlanFromOpt, PlanPriorOpt, StrictPlanOpt
from qa.run.dry_run import PlannedArm, dry_run
from qa.files.verdict import RunVerdict, Verdict

console = Console()


def _print_plan(spec_path: Path, planned: list[PlannedArm]) -> None:
    console.print(f"[bold]dry run[/bold] of {spec_path}: spec is valid; nothing is loaded or written")
    for arm in planned:
        console.print(f"\n[bold]{arm.role}[/bold]: engine={arm.engine} model={arm.model}")
        console.print("  engine arguments: " + json.dumps(arm.engine_args, sort_keys=True, default=str))
        if arm.server is not None:
            console.print("  server (started on 127.0.0.1, base_url filled in): "
                          + json.dumps(arm.server, sort_keys=True, default=str))
        if arm.env:
            console.print("  environment: " + json.dumps(arm.env, sort_keys=True))
        for note in arm.notes:
            console.print(f"  note: {note}")
        if arm.tasks:
            table = Table("task", "items available", "items", "repeats", "samples")
            for t in arm.tasks:
                table.add_row(t.task, str(t.items_available), str(t.items), str(t.repeats), str(t.samples))
            console.print(table)
            console.print(f"  total samples: {sum(t.samples for t in arm.tasks)}")


def print_matrix(verdict: RunVerdict) -> None:
    """The candidate x task status matrix of a several-candidate run."""
    tasks = list(dict.fromkeys(t for c in verdict.candidates for t in c.tasks))
    table = Table("candidate", "verdict", *tasks, title=f"each candidate vs {verdict.baseline}")
    for c in verdict.candidates:
        table.add_row(c.name, c.status, *(c.tasks.get(t, "-") for t in tasks))
    console.print(table)


def _print_verdict(verdict: Verdict | RunVerdict, run_dir: Path) -> None:
    colour = {"pass": "green", "fail": "red", "inconclusive": "yellow"}[verdict.status]
    if isinstance(verdict, RunVerdict):
        print_matrix(verdict)
    else:
        table = Table("task", "status", "reason")
        for t in verdict.tasks:
            table.add_row(t.task, t.status, t.reason)
        console.print(table)
    console.print(f"[bold {colour}]{verdict.summary}[/bold {colour}]")  # the summary starts with the status
    more = "candidates/<name>/, junit.xml, summary.md" if isinstance(verdict, RunVerdict) else "comparison.json"
    console.print(f"report: {run_dir / 'report.html'}  (and report.md, {more}, verdict.json)")


@app.command("run")
def run_command(
    spec_file: Annotated[Path, typer.Argument(help="Run spec (TOML); see examples/.")],
    out: Annotated[Path | None, typer.Option("--out", help="Run directory (default reports/runs/<spec name>).")] = None,
    data_dir: DataDirOpt = None,
    dry: Annotated[bool, typer.Option("--dry-run", help="Validate the spec; print engine arguments, item counts and the power plan.")] = False,
    strict_plan: StrictPlanOpt = False,
    plan_prior: PlanPriorOpt = None,
    plan_from: PlanFromOpt = None,
) -> None:
    """Calibrate (if asked) -> each arm in its own process -> compare -> gate -> report."""
    from qa.run.pipeline import resolve_data_dir
    from qa.plan.power import PlanOptions, announce_plan, parse_prior_options
    from qa.files.rundir import default_run_dir
    from qa.files.spec import load_spec

    plan = PlanOptions(priors=parse_prior_options(plan_prior or []), from_run=plan_from, strict=strict_plan)
    if dry:
        spec = load_spec(spec_file)
        data = resolve_data_dir(spec, data_dir)
        _print_plan(spec_file, dry_run(spec, data, out or default_run_dir(spec)))
        console.print()
        announce_plan(spec, data, spec_file.resolve().parent, plan)  # PlanError (exit 2) under --strict-plan
        raise typer.Exit(0)
    result = api.run(spec_file, out, data_dir=data_dir, plan=plan)
    _print_verdict(result.verdict, result.run_dir)
    raise typer.Exit(result.verdict.exit_code)
