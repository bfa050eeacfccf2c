"""`qa gate RUN_DIR`: a thin shell over `qa.api.gate` (and `qa.api.gate_candidates`).

gate exits 0 pass, 1 fail, 3 inconclusive (2: usage or input error, printed as one line).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qa import api
from qa.cli.app import app
from qa.cli.options import PolicyOpt, RunDirArg
from qa.cli.show import print_matrix, print_verdict
from qa.gate.junit import write_junit
from qa.gate.summary import write_summary


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
