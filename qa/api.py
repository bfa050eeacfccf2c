"""The Python API behind every `qa` command: typed arguments in, typed results out.

    from qa import run, compare, gate, report
    result = run(Path("examples/smollm2_nvfp4_kv.toml"), data_dir=Path("../shared/data"))
    verdict = gate(result.run_dir, Path("gate.toml"))   # re-gate under another policy
    report(result.run_dir)
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qa.comparison import Comparison, StatsSettings
from qa.errors import QAError
from qa.gate.verdict import Verdict
from qa.policy import Policy, load_policy, resolve_policy
from qa.rundir import RunDir
from qa.spec import RunSpec

if TYPE_CHECKING:
    from qa.report import ReportPaths

Progress = Callable[[str, int, int], None]  # (what, done, total)


@dataclass(frozen=True)
class RunResult:
    """A finished `run`: where it is and what the gate decided."""

    run_dir: Path
    verdict: Verdict


def run(spec: Path | RunSpec, out: Path | None = None, *, data_dir: Path | None = None,
        spec_dir: Path | None = None) -> RunResult:
    """Run a spec end to end into `out` (default reports/runs/<name>), resuming a run of the same spec.
    A spec file's relative paths (policy) are read from its folder, or from `spec_dir`."""
    from qa.pipeline import resolve_data_dir
    from qa.pipeline import run as run_pipeline
    from qa.rundir import default_run_dir
    from qa.spec import load_spec

    if isinstance(spec, Path):
        spec_dir = spec_dir or spec.resolve().parent
        spec = load_spec(spec)
    run_dir = out or default_run_dir(spec)
    verdict = run_pipeline(spec, run_dir, data_dir=resolve_data_dir(spec, data_dir), spec_dir=spec_dir)
    return RunResult(run_dir=run_dir, verdict=verdict)


def compare(baseline: Path, candidate: Path, out: Path | None = None, settings: StatsSettings | None = None, *,
            rerun: Path | None = None, progress: Progress | None = None) -> Comparison:
    """Pair two arms' folders (records/<arm> or lm-eval --log_samples; plus an optional baseline rerun)
    and compute the comparison; with `out`, write `out`/comparison.json atomically."""
    from qa.analyze import compare_arms, load_arm

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
            return resolve_policy(ref, relative_to=run_dir)
    return resolve_policy(None)


def decide(comparison: Comparison, policy: Policy | Path | None = None) -> Verdict:
    """The gate's verdict on a comparison under a policy (default: the shipped one); writes nothing."""
    from qa.gate.rules import decide as decide_rules

    return decide_rules(comparison, policy if isinstance(policy, Policy) else load_policy(policy))


def gate(run_dir: Path, policy: Policy | Path | None = None) -> Verdict:
    """Decide `run_dir`/comparison.json under a policy (see `policy_for_run`); write verdict.json."""
    from qa.gate.rules import decide as decide_rules

    rd = RunDir(run_dir)
    if not rd.root.is_dir():
        raise QAError(f"{run_dir}: no such run directory")
    verdict = decide_rules(rd.load_comparison(), policy_for_run(run_dir, policy), rd.comparison_sha256())
    rd.save_verdict(verdict)
    return verdict


def report(run_dir: Path, policy: Policy | Path | None = None, out: Path | None = None) -> ReportPaths:
    """Write report.md and a self-contained report.html (re-gated under `policy` when given)."""
    from qa.report import render

    chosen = policy if isinstance(policy, Policy) or policy is None else load_policy(policy)
    return render(run_dir, chosen, out)
