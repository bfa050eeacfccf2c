"""The Python API behind every `qa` command: typed arguments in, typed results out. The front door: nothing
inside the toolkit imports it; the CLI and users do.

    from qa.api import run, compare, gate, report
    result = run(Path("examples/smollm2_nvfp4_kv.toml"), data_dir=Path("../shared/data"))
    verdict = gate(result.run_dir, Path("gate.toml"))   # re-gate under another policy
    report(result.run_dir)

`run` and `dry_run` resolve the spec once (qa.pipeline.resolve) and hand the ResolvedRun to every step; `gate`,
`report` and `compare` are the steps of qa.steps on folders. A run with several candidates keeps each
candidate's comparison, verdict and report in candidates/<name>/; `gate_candidates` and `report_candidates`
add the run-level verdict.json, junit.xml, summary.md and the matrix report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from evals.data import resolve_data_dir
from qa.files.comparison import Comparison, StatsSettings
from qa.files.policy import Policy, load_policy
from qa.files.rundir import default_run_dir
from qa.files.spec import RunSpec, load_spec
from qa.files.verdict import RunVerdict, Verdict
from qa.gate.decide import decide as gate_decision
from qa.gate.provenance import load_kv_provenance
from qa.pipeline import stages
from qa.pipeline.dry_run import PlannedArm
from qa.pipeline.dry_run import dry_run as planned_arms
from qa.pipeline.resolve import resolve_run
from qa.pipeline.resolved_run import ResolvedRun
from qa.plan.power import PlanOptions, RunPlan
from qa.report import ReportPaths
from qa.steps import Arms, Progress, candidate_names, compare_folders, gate_folder, report_folder, run_policy
from qa.steps import gate_candidates as gate_each
from qa.steps import report_candidates as report_each

__all__ = ["DryRun", "RunResult", "candidate_names", "compare", "decide", "dry_run", "gate", "gate_candidates",
           "report", "report_candidates", "resolve", "run"]


@dataclass(frozen=True)
class RunResult:
    """A finished `run`: where it is and what the gate decided (a RunVerdict when it has several candidates)."""

    run_dir: Path
    verdict: Verdict | RunVerdict


@dataclass(frozen=True)
class DryRun:
    """What `run` would do: the resolved run, each arm as the dry run shows it, and the power plan."""

    resolved: ResolvedRun
    arms: list[PlannedArm]
    plan: RunPlan


def resolve(spec: Path | RunSpec, out: Path | None = None, *, data_dir: Path | None = None,
            spec_dir: Path | None = None) -> ResolvedRun:
    """A spec (a file, or parsed) resolved once into the run directory `out` (default reports/runs/<name>).
    A spec file's relative policy path is read from its folder, or from `spec_dir`; the data folder is
    `data_dir`, else the spec's, else $QA_DATA_DIR, else the hub."""
    if isinstance(spec, Path):
        spec_dir = spec_dir or spec.resolve().parent
        spec = load_spec(spec)
    return resolve_run(spec, out or default_run_dir(spec), data_dir=resolve_data_dir(data_dir or spec.data_dir),
                       spec_dir=spec_dir)


def run(spec: Path | RunSpec, out: Path | None = None, *, data_dir: Path | None = None,
        spec_dir: Path | None = None, plan: PlanOptions | None = None) -> RunResult:
    """Run a spec end to end (`resolve`, then qa.pipeline.stages), resuming a run of the same spec; `plan` sets
    the power plan's priors and strictness (qa.plan.power)."""
    resolved = resolve(spec, out, data_dir=data_dir, spec_dir=spec_dir)
    return RunResult(run_dir=resolved.rd.root, verdict=stages.run(resolved, plan))


def dry_run(spec: Path | RunSpec, out: Path | None = None, *, data_dir: Path | None = None,
            spec_dir: Path | None = None, plan: PlanOptions | None = None) -> DryRun:
    """What `run` would do, writing nothing (a model is loaded only to fit a model folder's K/V scales,
    qa.pipeline.scale_fit): the same resolution, checks and power plan (what this machine cannot check is a
    note); PlanError under a strict plan."""
    resolved = resolve(spec, out, data_dir=data_dir, spec_dir=spec_dir)
    started = stages.start(resolved, plan, strict=False)
    return DryRun(resolved, planned_arms(resolved, started.checks), started.plan)


def compare(baseline: Path, candidate: Path, out: Path | None = None, settings: StatsSettings | None = None, *,
            rerun: Path | None = None, progress: Progress | None = None) -> Comparison:
    """Pair two arms' folders (records/<arm> or lm-eval --log_samples; plus an optional baseline rerun)
    and compute the comparison; with `out`, write `out`/comparison.json atomically."""
    return compare_folders(Arms(baseline, candidate, rerun), out, settings or StatsSettings(), progress)


def decide(comparison: Comparison, policy: Policy | Path | None = None, candidate: Path | None = None) -> Verdict:
    """The gate's verdict on a comparison under a policy (default: the shipped one), the KV-scale rule judged
    on the arm.json in the `candidate` records folder when it has one; writes nothing."""
    chosen = policy if isinstance(policy, Policy) else load_policy(policy)
    return gate_decision(comparison, chosen, load_kv_provenance(candidate) if candidate is not None else None)


def gate(run_dir: Path, policy: Policy | Path | None = None) -> Verdict:
    """Decide `run_dir`/comparison.json under a policy (default: the one the run recorded); write verdict.json."""
    return gate_folder(run_dir, run_policy(run_dir, policy))


def gate_candidates(run_dir: Path, policy: Policy | Path | None = None) -> tuple[RunVerdict, dict[str, Verdict]]:
    """Gate every candidate of a several-candidate run (one policy for all, default the run's), then write
    the run-level verdict.json, junit.xml and summary.md."""
    return gate_each(run_dir, run_policy(run_dir, policy))


def report(run_dir: Path, policy: Policy | Path | None = None, out: Path | None = None) -> ReportPaths:
    """Write report.md and a self-contained report.html (re-gated under `policy` when given)."""
    return report_folder(run_dir, policy if isinstance(policy, Policy) or policy is None else load_policy(policy), out)


def report_candidates(run_dir: Path, policy: Policy | Path | None = None) -> tuple[Path, Path]:
    """Each candidate's report, then the run root's report.md and report.html with the candidate x task
    matrix (re-gated under `policy` when given); their paths."""
    return report_each(run_dir, policy if isinstance(policy, Policy) or policy is None else load_policy(policy))
