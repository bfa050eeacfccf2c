"""The run-level decision of a several-candidate run: each candidate was gated on its own against the same
baseline; the run passes only when every candidate passes (any fail: fail; else inconclusive)."""

from __future__ import annotations

from qa.errors import QAError
from qa.files.verdict import CandidateVerdict, RunVerdict, Status, Verdict


def run_verdict(verdicts: dict[str, Verdict], folders: dict[str, str]) -> RunVerdict:
    """The run-level verdict of candidates gated on their own (name -> verdict, name -> folder)."""
    if not verdicts:
        raise QAError("no candidate verdicts to combine")
    statuses = [v.status for v in verdicts.values()]
    status: Status = "fail" if "fail" in statuses else "pass" if set(statuses) == {"pass"} else "inconclusive"
    passed = [n for n, v in verdicts.items() if v.status == "pass"]
    counts = ", ".join(f"{statuses.count(s)} {s}" for s in ("pass", "fail", "inconclusive") if s in statuses)
    summary = (f"{status.upper()}: {len(passed)} of {len(verdicts)} candidates passed ({counts}); "
               f"passed: {', '.join(passed) if passed else 'none'}")
    first = next(iter(verdicts.values()))
    return RunVerdict(
        status=status, summary=summary, baseline=first.baseline, passed=passed,
        candidates=[CandidateVerdict(name=n, status=v.status, summary=v.summary,
                                     tasks={t.task: t.status for t in v.tasks},
                                     reasons={t.task: t.reason for t in v.tasks}, folder=folders[n])
                    for n, v in verdicts.items()],
        policy_name=first.policy.name, policy_sha256=first.policy_sha256)
