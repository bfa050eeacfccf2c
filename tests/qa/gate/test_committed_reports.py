"""Every run folder committed under reports/ re-gates, from its comparison.json alone (schema 1 files
are migrated on load), to the status its verdict.json records under the same policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from qa.gate.rules import decide
from qa.rundir import RunDir

REPORTS = Path(__file__).resolve().parents[3] / "reports"
RUNS = sorted(p.parent for p in REPORTS.glob("**/verdict.json") if "runs" not in p.parts)


def test_there_are_committed_runs() -> None:
    assert len(RUNS) >= 10


@pytest.mark.parametrize("run", RUNS, ids=[str(r.relative_to(REPORTS)) for r in RUNS])
def test_committed_run_regates_to_its_recorded_status(run: Path) -> None:
    rd = RunDir(run)
    recorded = rd.load_verdict()
    again = decide(rd.load_comparison(), recorded.policy)
    assert again.status == recorded.status
    assert [(t.task, t.status) for t in again.tasks] == [(t.task, t.status) for t in recorded.tasks]
