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
from qa.cli.show import print_matrix
from qa.files.verdict import RunVerdict, Verdict
from qa.plan.power import PlanOptions, announce_plan, parse_prior_options

console = Console()


def _print_plan(spec_path: Path, dry: api.DryRun) -> None:
    console.print(f"[bold]dry run[/bold] of {spec_path}: spec is valid; nothing is loaded or written")
    tasks = dry.resolved.tasks
    for arm in dry.arms:
        console.print(f"\n[bold]{arm.name}[/bold]: engine={arm.engine} model={arm.model}")
        console.print("  engine arguments: " + json.dumps(arm.engine_args, sort_keys=True, default=str))
        if arm.server is not None:
            console.print("  server (started on 127.0.0.1, base_url filled in): "
                          + json.dumps(arm.server, sort_keys=True, default=str))
        if arm.env:
            console.print("  environment: " + json.dumps(arm.env, sort_keys=True))
        for note in arm.notes:
            console.print(f"  note: {note}")
        if arm.kv_layers is not None:
            console.print(f"  kv layers: {arm.kv_layers}", highlight=False)
        if tasks and arm.engine != "lmeval":
            table = Table("task", "items available", "items", "repeats", "samples")
            for t in tasks:
                table.add_row(t.name, str(t.items_available), str(t.n_items), str(t.repeats), str(t.samples))
            console.print(table)
            console.print(f"  total samples: {sum(t.samples for t in tasks)}")


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
    plan = PlanOptions(priors=parse_prior_options(plan_prior or []), from_run=plan_from, strict=strict_plan)
    if dry:
        planned = api.dry_run(spec_file, out, data_dir=data_dir, plan=plan)
        _print_plan(spec_file, planned)
        console.print()
        announce_plan(planned.plan, strict_plan)  # PlanError (exit 2) under --strict-plan
        raise typer.Exit(0)
    result = api.run(spec_file, out, data_dir=data_dir, plan=plan)
    _print_verdict(result.verdict, result.run_dir)
    raise typer.Exit(result.verdict.exit_code)
