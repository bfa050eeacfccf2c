"""`qa data list` and `qa data verify`: thin shells over `evals.data` (the registry and `verify`).

verify exits 0 when every split loads with its expected count and every file matches manifest.json
(when the data dir has one), 1 otherwise; 2 for a usage error.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from evals import data
from evals.errors import DataError
from qa.cli.app import app
from qa.cli.options import DataDirOpt

data_app = typer.Typer(help="Datasets: list them, verify a local data folder.", no_args_is_help=True)
app.add_typer(data_app, name="data")

NamesArg = Annotated[list[str] | None, typer.Argument(help="Datasets to verify (default: all).")]


def _console() -> Console:
    return Console() if Console().is_terminal else Console(width=160)


@data_app.command("list")
def list_command(data_dir: DataDirOpt = None) -> None:
    """List the datasets, their splits and item counts, and where they would be read from."""
    root = data.resolve_data_dir(data_dir)
    table = Table(
        title=f"datasets ({root if root else 'hub: ' + ('offline' if data.hub_offline() else 'online')})"
    )
    for col in ("dataset", "splits (items)", "source", "note"):
        table.add_column(col, overflow="fold")
    for name, spec in data.DATASETS.items():
        splits = ", ".join(f"{s} ({p.count})" for s, p in spec.splits.items())
        if root is None:
            source = spec.hub.path + (f" [{spec.hub.name}]" if spec.hub.name else "")
        else:
            files = data.data_files([name])
            present = sum((root / f).is_file() for f in files)
            source = files[0] if len(files) == 1 else f"{files[0].split('/')[0]}/ ({len(files)} files)"
            source += "" if present == len(files) else f"  [{len(files) - present} missing]"
        table.add_row(name, splits, source, data.DATA_NOTES.get(name, ""))
    _console().print(table)


@data_app.command("verify")
def verify_command(names: NamesArg = None, data_dir: DataDirOpt = None) -> None:
    """Load every split (counts, shapes) and check file sha256s against the folder's manifest.json."""
    root = data.resolve_data_dir(data_dir)
    if root is None:
        raise DataError(f"verify needs a local data folder: pass --data-dir or set {data.DATA_DIR_ENV}")
    checks = data.verify(root, names or None)
    table = Table(title=f"data verify: {root}")
    for col in ("dataset", "check", "status", "detail"):
        table.add_column(col, overflow="fold")
    for c in checks:
        table.add_row(c.dataset, c.subject, "[green]ok[/]" if c.ok else "[bold red]FAIL[/]", c.detail)
    _console().print(table)
    failed = sum(not c.ok for c in checks)
    typer.echo(f"{len(checks) - failed} ok, {failed} failed")
    raise typer.Exit(1 if failed else 0)
