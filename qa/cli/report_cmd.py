"""`qa report RUN_DIR`: a thin shell over `qa.api.report` (and `qa.api.report_candidates`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qa import api
from qa.cli.app import app
from qa.cli.options import RunDirArg
from qa.errors import QAError


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
