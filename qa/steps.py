"""The steps after the arms, on a run directory alone: compare, gate, report. `qa run`'s pipeline and the API
(`qa gate`, `qa report`, `qa compare`) call these same functions, so a finished run re-gated later gets
exactly the decision `qa run` made.

A run with several candidates keeps each candidate's comparison, verdict and report in candidates/<name>/
(the same steps, one folder each); `gate_candidates` and `report_candidates` add the run-level verdict.json,
junit.xml, summary.md and the matrix report. Which layout a folder has, and which policy it was gated under,
comes from its resolved.json (qa.files.resolved_json); a folder older than that file falls back to its spec.toml.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from qa.compare.arms import check_formats, compare_arms, load_arm
from qa.errors import QAError
from qa.files.comparison import Comparison, StatsSettings
from qa.files.policy import Policy, load_policy
from qa.files.rundir import RunDir
from qa.files.spec import FIXED_ROLES, LEGACY_CANDIDATE
from qa.files.verdict import RunVerdict, Verdict
from qa.gate.candidates import run_verdict
from qa.gate.decide import decide_folder
from qa.gate.junit import write_junit
from qa.gate.summary import write_summary
from qa.report import ReportPaths, render
from qa.report.gather import resolve_verdict
from qa.report.matrix import render_matrix

Progress = Callable[[str, int, int], None]  # (what, done, total)


@dataclass(frozen=True)
class Arms:
    """The record folders one comparison pairs: baseline, candidate and the optional baseline rerun."""

    baseline: Path
    candidate: Path
    rerun: Path | None = None


def compare_folders(arms: Arms, out: Path | None, settings: StatsSettings,
                    progress: Progress | None = None) -> Comparison:
    """Pair the arms (records/<arm> folders, lm-eval --log_samples folders or Inspect AI logs) and compute the
    comparison; with `out`, write `out`/comparison.json atomically."""
    paths = [p for p in (arms.baseline, arms.candidate, arms.rerun) if p is not None]
    check_formats(paths)
    loaded = [load_arm(p) for p in paths]
    comparison = compare_arms(loaded[0], loaded[1], settings, progress, loaded[2] if len(loaded) > 2 else None)
    if out is not None:
        RunDir(out).save_comparison(comparison)
    return comparison


def run_policy(run_dir: Path, policy: Policy | Path | None = None) -> Policy:
    """`policy` when given (a file is read); else the policy the run recorded (RunDir.recorded_policy)."""
    if isinstance(policy, Policy):
        return policy
    if policy is not None:
        return load_policy(policy)
    return RunDir(run_dir).recorded_policy()


def candidate_names(run_dir: Path) -> list[str] | None:
    """The candidates of a several-candidate run directory (laid out in candidates/<name>/), else None."""
    rd = RunDir(run_dir)
    if rd.top != rd.root:
        return None
    if rd.resolved.is_file():
        cands = rd.load_resolved().candidates
        return [a.name for a in cands] if any(a.out != "." for a in cands) else None
    if not rd.spec_file.is_file():
        return None
    try:  # a folder older than resolved.json: the arm names of its spec.toml
        arms = tomllib.loads(rd.spec_file.read_text(encoding="utf-8")).get("arms")
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None
    names = [n for n in arms if n not in FIXED_ROLES] if isinstance(arms, dict) else []
    return names if names and names != [LEGACY_CANDIDATE] else None


def several(run_dir: Path) -> list[str]:
    """`candidate_names`, or QAError for a run with one candidate at its root."""
    names = candidate_names(run_dir)
    if names is None:
        raise QAError(f"{run_dir}: not a run with several candidates (no candidates/<name>/ layout)")
    return names


def gate_folder(run_dir: Path, policy: Policy) -> Verdict:
    """Decide `run_dir`/comparison.json under `policy` (the gate: every rule); write verdict.json."""
    rd = RunDir(run_dir)
    if not rd.root.is_dir():
        raise QAError(f"{run_dir}: no such run directory")
    verdict = decide_folder(rd, policy)
    rd.save_verdict(verdict)
    return verdict


def _folders(rd: RunDir, names: list[str]) -> dict[str, str]:
    return {n: rd.candidate(n).root.relative_to(rd.root).as_posix() for n in names}


def combine_candidates(run_dir: Path, verdicts: dict[str, Verdict]) -> RunVerdict:
    """The run-level verdict of the candidates' verdicts; writes verdict.json, junit.xml and summary.md."""
    rd = RunDir(run_dir)
    combined = run_verdict(verdicts, _folders(rd, list(verdicts)))
    rd.save_run_verdict(combined)
    write_junit(rd.junit, list(verdicts.values()))
    rd.step_summary.unlink(missing_ok=True)  # written whole, never appended to
    write_summary(rd.step_summary, (combined, list(verdicts.values())))
    return combined


def gate_candidates(run_dir: Path, policy: Policy) -> tuple[RunVerdict, dict[str, Verdict]]:
    """Gate every candidate of a several-candidate run in candidates/<name>/ (`gate_folder`, one policy for
    all), then write the run-level verdict.json, junit.xml and summary.md."""
    verdicts = {n: gate_folder(RunDir(run_dir).candidate(n).root, policy) for n in several(run_dir)}
    return combine_candidates(run_dir, verdicts), verdicts


def report_folder(run_dir: Path, policy: Policy | None = None, out: Path | None = None) -> ReportPaths:
    """Write report.md and a self-contained report.html (re-gated under `policy` when given)."""
    if not run_dir.is_dir():
        raise QAError(f"{run_dir}: no such run directory")
    return render(run_dir, policy, out)


def report_candidates(run_dir: Path, policy: Policy | None = None) -> tuple[Path, Path]:
    """Each candidate's report in candidates/<name>/ (`report_folder`), then the run root's report.md and
    report.html with the candidate x task matrix (re-gated under `policy` when given); their paths."""
    rd = RunDir(run_dir)
    verdicts: dict[str, Verdict] = {}
    for name in several(run_dir):
        crd = rd.candidate(name)
        report_folder(crd.root, policy)
        verdicts[name], _ = resolve_verdict(crd, crd.load_comparison(), policy)
    return render_matrix(rd.root, run_verdict(verdicts, _folders(rd, list(verdicts))), verdicts)
