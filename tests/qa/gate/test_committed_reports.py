"""Every run folder committed under reports/ re-gates, from its comparison.json alone (schema 1 files were
rewritten by scripts/migrate_comparisons.py) and its batch_invariance.json where it holds one, to the status its verdict.json records under the same policy. A several-candidate
run's root holds a run-level verdict (RunVerdict): each of its candidates/<name>/ folders is re-gated as
a run folder, and the root must record exactly those candidates' statuses. Withdrawn runs
(reports/withdrawn/, reports/WITHDRAWN.md) are not re-gated."""

from __future__ import annotations

from pathlib import Path

import pytest

from qa.compare.batch_invariance import INVARIANCE_FILE, BatchInvariance
from qa.files.rundir import RunDir
from qa.gate.batch_invariance import apply_invariance, decide_invariance
from qa.gate.rules import apply_rules

REPORTS = Path(__file__).resolve().parents[3] / "reports"
FOLDERS = sorted(p.parent for p in REPORTS.glob("**/verdict.json")
                 if "runs" not in p.parts and "withdrawn" not in p.parts)  # reports/WITHDRAWN.md
SEVERAL = [f for f in FOLDERS if (f / "candidates").is_dir()]  # several-candidate run roots
RUNS = [f for f in FOLDERS if f not in SEVERAL]


def test_there_are_committed_runs() -> None:
    assert len(RUNS) >= 10


@pytest.mark.parametrize("run", RUNS, ids=[str(r.relative_to(REPORTS)) for r in RUNS])
def test_committed_run_regates_to_its_recorded_status(run: Path) -> None:
    rd = RunDir(run)
    recorded = rd.load_verdict()
    again = apply_rules(rd.load_comparison(), recorded.policy)
    if (run / INVARIANCE_FILE).is_file():  # a load run: `qa gate` adds the batch-invariance rule
        again = apply_invariance(again, decide_invariance(BatchInvariance.load(run / INVARIANCE_FILE), recorded.policy))
    assert again.status == recorded.status
    assert [(t.task, t.status) for t in again.tasks] == [(t.task, t.status) for t in recorded.tasks]


@pytest.mark.parametrize("run", SEVERAL, ids=[str(r.relative_to(REPORTS)) for r in SEVERAL])
def test_a_several_candidate_root_records_its_candidates_verdicts(run: Path) -> None:
    root = RunDir(run).load_run_verdict()
    for cand in root.candidates:
        own = RunDir(run / cand.folder).load_verdict()
        assert (cand.status, cand.tasks) == (own.status, {t.task: t.status for t in own.tasks}), cand.name
    statuses = {c.status for c in root.candidates}
    assert root.status == ("fail" if "fail" in statuses else "pass" if statuses == {"pass"} else "inconclusive")
