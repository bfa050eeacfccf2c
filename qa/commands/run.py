"""`qa run SPEC.toml`: the whole pipeline, or (--dry-run) what it would do without loading a model."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from qa.app import app

console = Console()


def _print_plan(spec_path: Path, plan) -> None:  # plan: list[PlannedArm]
    console.print(f"[bold]dry run[/bold] of {spec_path}: spec is valid; nothing is loaded or written")
    for arm in plan:
        console.print(f"\n[bold]{arm.role}[/bold]: engine={arm.engine} model={arm.model}")
        console.print("  engine arguments: " + json.dumps(arm.engine_args, sort_keys=True, default=str))
        if arm.server is not None:
            console.print("  server (started on 127.0.0.1, base_url filled in): "
                          + json.dumps(arm.server, sort_keys=True, default=str))
        if arm.tasks:
            table = Table("task", "items available", "items", "repeats", "samples")
            for t in arm.tasks:
                table.add_row(t.task, str(t.items_available), str(t.items), str(t.repeats), str(t.samples))
            console.print(table)
            console.print(f"  total samples: {sum(t.samples for t in arm.tasks)}")


def _print_verdict(verdict, run_dir: Path) -> None:
    colour = {"pass": "green", "fail": "red", "inconclusive": "yellow"}.get(verdict.status, "white")
    table = Table("task", "status", "reason")
    for t in verdict.tasks:
        table.add_row(t.task, t.status, t.reason)
    console.print(table)
    console.print(f"[bold {colour}]{verdict.summary}[/bold {colour}]")  # the summary starts with the status
    console.print(f"report: {run_dir / 'report.html'}  (and report.md, comparison.json, verdict.json)")


@app.command("run")
def run_command(
    spec_file: Path = typer.Argument(..., help="Run spec (TOML); see examples/."),
    out: Path | None = typer.Option(None, "--out", help="Run directory (default reports/runs/<spec name>)."),
    data_dir: Path | None = typer.Option(None, "--data-dir", help="Local data folder (default $QA_DATA_DIR)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate the spec; print engine arguments and item counts."),
) -> None:
    """Calibrate (if asked) -> each arm in its own process -> compare -> gate -> report."""
    from qa import pipeline
    from qa.gate import EXIT_CODES
    from qa.rundir import default_run_dir
    from qa.spec import load_spec

    spec = load_spec(spec_file)
    data = pipeline._data_dir(spec, data_dir)
    run_dir = out or default_run_dir(spec)
    if dry_run:
        _print_plan(spec_file, pipeline.plan(spec, data, run_dir))
        raise typer.Exit(0)
    verdict = pipeline.run(spec, run_dir, data_dir=data, spec_dir=spec_file.resolve().parent)
    _print_verdict(verdict, run_dir)
    raise typer.Exit(EXIT_CODES[verdict.status])
