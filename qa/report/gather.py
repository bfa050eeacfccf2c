"""Everything a report shows, read from one run directory through `RunDir` into one `ReportInputs`:
the comparison, the verdict to show (see `resolve_verdict`), spec text, resolved.json, env.json,
kv_inspect.json, each arm's engine facts and the changed answers. Only comparison.json is required."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from evals.errors import RecordError
from evals.records.arm_file import ARM_FILE, ArmManifest
from qa.errors import QAError
from qa.files.comparison import Comparison, Estimate
from qa.files.policy import Policy
from qa.files.resolved_json import ResolvedRecord
from qa.files.rundir import RunDir
from qa.files.verdict import TaskVerdict, Verdict
from qa.gate.decide import decide_folder
from qa.report.examples import Example, find_examples
from quant.errors import QuantError
from quant.kv.inspect_report import InspectReport, load_inspect


@dataclass(frozen=True)
class ArmEngine:
    """What an arm's engine said of itself in records/<arm>/arm.json."""

    arm: str
    engine: str
    deterministic: bool


@dataclass(frozen=True)
class ReportInputs:
    """Everything a report shows, gathered from one run directory."""

    run_dir: Path
    comparison: Comparison
    verdict: Verdict
    verdict_source: str  # one line: where the verdict shown comes from
    spec_text: str | None = None
    resolved: ResolvedRecord | None = None  # resolved.json; None: a run directory written before it
    env: dict[str, object] | None = None
    kv: InspectReport | None = None
    kv_problem: str | None = None  # why a kv_inspect.json present in the run could not be shown
    arms: list[ArmEngine] = field(default_factory=list)
    examples: dict[str, list[Example]] = field(default_factory=dict)


def resolve_verdict(rd: RunDir, comparison: Comparison, policy: Policy | None) -> tuple[Verdict, str]:
    """The verdict to show and where it comes from: `policy` given -> decided under it; else verdict.json
    when it was made from these comparison.json bytes; else decided again under verdict.json's policy
    (stale) or, with no verdict.json, under the policy the run recorded (`RunDir.recorded_policy`). Every
    decision is the gate's own (`qa.gate.decide.decide_folder`: every rule, the KV-scale rule included)."""
    if policy is not None:
        return decide_folder(rd, policy, comparison), f"evaluated for this report under policy '{policy.name}'"
    if rd.verdict.is_file():
        verdict = rd.load_verdict()
        if verdict.comparison_sha256 == rd.comparison_sha256():
            return verdict, "verdict.json"
        return (
            decide_folder(rd, verdict.policy, comparison),
            "re-evaluated: verdict.json was made from another comparison.json; same policy",
        )
    chosen = rd.recorded_policy()
    return decide_folder(rd, chosen, comparison), (
        f"no verdict.json: evaluated under policy '{chosen.name}' (the run's, else the shipped default)"
    )


def gated_estimate(comparison: Comparison, tv: TaskVerdict) -> Estimate | None:
    """The estimate a task verdict was decided on."""
    for e in comparison.estimates:
        if e.task == tv.task and f"{e.metric},{e.filter}" == tv.metric:
            return e
    return None


def read_kv(rd: RunDir) -> tuple[InspectReport | None, str | None]:
    """(kv_inspect.json's report, None), (None, why it cannot be shown), or (None, None) when absent."""
    if not rd.kv_inspect.exists():
        return None, None
    try:
        return load_inspect(rd.kv_inspect), None
    except QuantError as exc:
        return None, str(exc)


def read_env(rd: RunDir) -> dict[str, object] | None:
    """env.json as a mapping (its keys are shown as provenance), or None when absent."""
    if not rd.env.is_file():
        return None
    try:
        loaded = json.loads(rd.env.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {rd.env.name: "unreadable"}
    return loaded if isinstance(loaded, dict) else {rd.env.name: loaded}


def read_arm_engines(rd: RunDir) -> list[ArmEngine]:
    """What each arm's engine said of itself in its arm.json (arms without a readable one: skipped)."""
    out = []
    for path in sorted(rd.records.glob(f"*/{ARM_FILE}")):
        try:
            info = ArmManifest.load(path).engine_info
        except RecordError:
            continue
        if info is not None:
            out.append(ArmEngine(path.parent.name, info.name, info.deterministic))
    return out


def gather(run_dir: Path, policy: Policy | None = None) -> ReportInputs:
    """Read everything the report shows from `run_dir` (comparison.json is required)."""
    rd = RunDir(run_dir)
    if not run_dir.is_dir():
        raise QAError(f"{run_dir}: no such run directory")
    comparison = rd.load_comparison()
    verdict, source = resolve_verdict(rd, comparison, policy)
    examples = {}
    for tv in verdict.tasks:
        est = gated_estimate(comparison, tv)
        if est is not None:
            examples[tv.task] = find_examples(rd, comparison, est)
    kv, kv_problem = read_kv(rd)
    return ReportInputs(
        run_dir=run_dir,
        comparison=comparison,
        verdict=verdict,
        verdict_source=source,
        spec_text=rd.spec_file.read_text(encoding="utf-8", errors="replace") if rd.spec_file.is_file() else None,
        resolved=rd.load_resolved() if rd.resolved.is_file() else None,
        env=read_env(rd),
        kv=kv,
        kv_problem=kv_problem,
        arms=read_arm_engines(rd),
        examples=examples,
    )
