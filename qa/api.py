"""The Python API behind every `qa` command: typed arguments in, typed results out.

    from qa import run, compare, gate, report
    result = run(Path("examples/smollm2_nvfp4_kv.toml"), data_dir=Path("../shared/data"))
    verdict = gate(result.run_dir, Path("gate.toml"))   # re-gate under another policy
    report(result.run_dir)

A run with several candidates keeps each candidate's comparison, verdict and report in
candidates/<name>/ (the same compare / gate / report, one folder each); `gate_candidates` and
`report_candidates` add the run-level verdict.json, junit.xml, summary.md and the matrix report.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qa.files.comparison import Comparison, StatsSettings
from qa.errors import QAError
from qa.files.verdict import RunVerdict, Verdict
from qa.files.policy import Policy, load_policy, resolve_policy
from qa.files.rundir import RunDir
from qa.files.spec import RunSpec

if TYPE_CHECKING:
    from qa.plan.power import PlanOptions
    from qa.report import ReportPaths

Progress = Callable[[str, int, int], None]  # (what, done, total)


@dataclass(frozen=True)
class RunResult:
    """A finished `run`: where it is and what the gate decided (a RunVerdict when it has several candidates)."""

    run_dir: Path
    verdict: Verdict | RunVerdict


def run(spec: Path | RunSpec, out: Path | None = None, *, data_dir: Path | None = None,
        spec_dir: Path | None = None, plan: PlanOptions | None = None) -> RunResult:
    """Run a spec end to end into `out` (default reports/runs/<name>), resuming a run of the same spec.
    A spec file's relative paths (policy) are read from its folder, or from `spec_dir`; `plan` sets the
    power plan's priors and strictness (qa.plan.power)."""
    from qa.run.pipeline import resolve_data_dir
    from qa.run.pipeline import run as run_pipeline
    from qa.files.rundir import default_run_dir
    from qa.files.spec import load_spec

    if isinstance(spec, Path):
        spec_dir = spec_dir or spec.resolve().parent
        spec = load_spec(spec)
    run_dir = out or default_run_dir(spec)
    verdict = run_pipeline(spec, run_dir, data_dir=resolve_data_dir(spec, data_dir), spec_dir=spec_dir,
                           plan=plan)
    return RunResult(run_dir=run_dir, verdict=verdict)


def compare(baseline: Path, candidate: Path, out: Path | None = None, settings: StatsSettings | None = None, *,
            rerun: Path | None = None, progress: Progress | None = None) -> Comparison:
    """Pair two arms' folders (records/<arm> or lm-eval --log_samples; plus an optional baseline rerun)
    and compute the comparison; with `out`, write `out`/comparison.json atomically."""
    from qa.compare.arms import compare_arms, load_arm

    rerun_arm = load_arm(rerun) if rerun is not None else None
    comparison = compare_arms(load_arm(baseline), load_arm(candidate), settings or StatsSettings(), progress, rerun_arm)
    if out is not None:
        RunDir(out).save_comparison(comparison)
    return comparison


def policy_for_run(run_dir: Path, policy: Policy | Path | None = None) -> Policy:
    """`policy` when given; else the policy named in the run's spec.toml; else the shipped default."""
    if isinstance(policy, Policy):
        return policy
    if policy is not None:
        return load_policy(policy)
    spec = RunDir(run_dir).spec
    if spec.is_file():
        try:
            ref = tomllib.loads(spec.read_text(encoding="utf-8")).get("policy")
        except tomllib.TOMLDecodeError as exc:
            raise QAError(f"{spec}: not valid TOML ({exc}); pass a policy explicitly") from None
        if isinstance(ref, str):
            return resolve_policy(ref, relative_to=RunDir(run_dir).top)
    return resolve_policy(None)


def decide(comparison: Comparison, policy: Policy | Path | None = None) -> Verdict:
    """The gate's verdict on a comparison under a policy (default: the shipped one); writes nothing."""
    from qa.gate.rules import decide as decide_rules

    return decide_rules(comparison, policy if isinstance(policy, Policy) else load_policy(policy))


def gate(run_dir: Path, policy: Policy | Path | None = None) -> Verdict:
    """Decide `run_dir`/comparison.json under a policy (see `policy_for_run`); write verdict.json."""
    from qa.gate.provenance import scales_rule
    from qa.gate.rules import decide as decide_rules

    rd = RunDir(run_dir)
    if not rd.root.is_dir():
        raise QAError(f"{run_dir}: no such run directory")
    chosen = policy_for_run(run_dir, policy)
    verdict = decide_rules(rd.load_comparison(), chosen, rd.comparison_sha256())
    verdict = scales_rule(verdict, rd.arm_records(verdict.candidate), chosen)  # KV-scale provenance
    rd.save_verdict(verdict)
    return verdict


def report(run_dir: Path, policy: Policy | Path | None = None, out: Path | None = None) -> ReportPaths:
    """Write report.md and a self-contained report.html (re-gated under `policy` when given)."""
    from qa.report import render

    chosen = policy if isinstance(policy, Policy) or policy is None else load_policy(policy)
    return render(run_dir, chosen, out)


def candidate_names(run_dir: Path) -> list[str] | None:
    """The candidates of a several-candidate run directory (laid out in candidates/<name>/), else None."""
    from qa.files.spec import FIXED_ROLES, LEGACY_CANDIDATE

    rd = RunDir(run_dir)
    if rd.top != rd.root or not rd.spec.is_file():
        return None
    try:  # only the arm names: a folder whose spec.toml is not a whole spec is gated as it always was
        arms = tomllib.loads(rd.spec.read_text(encoding="utf-8")).get("arms")
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None
    names = [n for n in arms if n not in FIXED_ROLES] if isinstance(arms, dict) else []
    return names if names and names != [LEGACY_CANDIDATE] else None


def _several(run_dir: Path) -> list[str]:
    names = candidate_names(run_dir)
    if names is None:
        raise QAError(f"{run_dir}: not a run with several candidates (no candidates/<name>/ layout)")
    return names


def _folders(rd: RunDir, names: list[str]) -> dict[str, str]:
    return {n: rd.candidate(n).root.relative_to(rd.root).as_posix() for n in names}


def combine_candidates(run_dir: Path, verdicts: dict[str, Verdict]) -> RunVerdict:
    """The run-level verdict of the candidates' verdicts; writes verdict.json, junit.xml and summary.md."""
    from qa.gate.junit import write_junit
    from qa.gate.summary import write_summary
    from qa.files.verdict import run_verdict

    rd = RunDir(run_dir)
    combined = run_verdict(verdicts, _folders(rd, list(verdicts)))
    rd.save_run_verdict(combined)
    write_junit(rd.junit, list(verdicts.values()))
    rd.step_summary.unlink(missing_ok=True)  # written whole, never appended to
    write_summary(rd.step_summary, (combined, list(verdicts.values())))
    return combined


def gate_candidates(run_dir: Path, policy: Policy | Path | None = None) -> tuple[RunVerdict, dict[str, Verdict]]:
    """Gate every candidate of a several-candidate run in candidates/<name>/ (`gate`, one policy for all),
    then write the run-level verdict.json, junit.xml and summary.md."""
    chosen = policy_for_run(run_dir, policy)
    verdicts = {n: gate(RunDir(run_dir).candidate(n).root, chosen) for n in _several(run_dir)}
    return combine_candidates(run_dir, verdicts), verdicts


def report_candidates(run_dir: Path, policy: Policy | Path | None = None) -> tuple[Path, Path]:
    """Each candidate's report in candidates/<name>/ (`report`), then the run root's report.md and
    report.html with the candidate x task matrix (re-gated under `policy` when given); their paths."""
    from qa.files.verdict import run_verdict
    from qa.report.gather import resolve_verdict
    from qa.report.matrix import render_matrix

    rd = RunDir(run_dir)
    chosen = policy if isinstance(policy, Policy) or policy is None else load_policy(policy)
    verdicts: dict[str, Verdict] = {}
    for name in _several(run_dir):
        crd = rd.candidate(name)
        report(crd.root, chosen)
        verdicts[name], _ = resolve_verdict(crd, crd.load_comparison(), chosen)
    return render_matrix(rd.root, run_verdict(verdicts, _folders(rd, list(verdicts))), verdicts)
