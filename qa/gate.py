"""The gate: re-decide every task of a comparison under a policy and write verdict.json.

The gate works from comparison.json numbers alone (delta, SEs, CIs, df, error counts), so a new
policy re-gates an old run without re-running anything. Per task, in this order:

1. errors:  either arm's share of errored samples above `max_error_rate` -> inconclusive;
2. information: both arms at the same floor or ceiling (e.g. 0% on GSM8K) -> inconclusive,
   "no information" (the report's answer agreement and KL divergence are then the signal);
3. each rule of the policy (noninferiority, tost, sigma) decides pass / fail / inconclusive;
   the sigma ("within k SE") rule is always computed and reported, deciding only when listed;
4. power: n < min_n or MDE > margin -> underpowered (inconclusive or fail, as the policy says),
   unless a rule already showed the candidate demonstrably worse (that stays a fail).

Across tasks the verdict is an intersection-union test (Berger 1982): pass only if every task
passes, each at alpha, uncorrected; any fail -> fail; otherwise inconclusive.
Exit codes: 0 pass, 1 fail, 3 inconclusive (2 is a usage or input error, raised elsewhere).
"""

from __future__ import annotations

import html
import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from scipy import stats as sps

from qa.comparison import Comparison, Estimate, Interval, load_comparison
from qa.errors import PolicyError, QAError
from qa.policy import AUTO_METRICS, Policy, TaskPolicy
from quant.fileio import atomic_write_text, sha256_file

VERDICT_SCHEMA_VERSION = 1
Status = Literal["pass", "fail", "inconclusive"]
Kind = Literal["decided", "errors", "no_information", "underpowered", "undefined", "missing"]
RuleName = Literal["noninferiority", "tost", "sigma"]
EXIT_CODES: dict[str, int] = {"pass": 0, "fail": 1, "inconclusive": 3}
Z_80 = sps.norm.ppf(0.8)  # 0.8416: the z of 80% power in "drop caught with 80% probability"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RuleResult(_Frozen):
    """One rule applied to one task; `decides` is False for a rule that is only reported."""

    rule: RuleName
    decides: bool
    status: Status
    detail: str  # one line, the numbers that decided it
    ci_level: float | None = None  # two-sided level of the CI used (0.90 for alpha = 0.05)
    ci: Interval | None = None
    ci_method: str | None = None
    margin: float | None = None
    k: float | None = None
    basis: str | None = None
    threshold: float | None = None  # sigma rule: k * SE_basis
    false_alarm_rate: float | None = None  # sigma rule: P(an identical candidate fails it)
    drop_caught_80: float | None = None  # sigma rule: true drop it catches with 80% probability


class TaskVerdict(_Frozen):
    """The gate's decision for one task: status, why (one line), and the rules behind it."""

    task: str
    metric: str  # "metric,filter"
    status: Status
    kind: Kind
    reason: str
    n: int = 0
    delta: float | None = None
    se_paired: float | None = None
    margin: float
    alpha: float
    mde: float | None = None  # at the policy's alpha and power, metric units
    n_needed: int | None = None  # items for MDE <= margin at this sd of differences
    error_rate_baseline: float | None = None
    error_rate_candidate: float | None = None
    rules: list[RuleResult] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)


class Verdict(_Frozen):
    """The whole verdict.json: overall status, a one-line summary, one TaskVerdict per task."""

    schema_version: Literal[1] = VERDICT_SCHEMA_VERSION
    status: Status
    summary: str
    baseline: str
    candidate: str
    sign_convention: str
    tasks: list[TaskVerdict]
    policy: Policy
    policy_sha256: str
    comparison_sha256: str | None = None

    @property
    def exit_code(self) -> int:
        """0 pass, 1 fail, 3 inconclusive."""
        return EXIT_CODES[self.status]


def pts(x: float | None, signed: bool = True) -> str:
    """Score units as accuracy points (0.021 -> '+2.1 pts'); '-' for undefined."""
    if x is None or not math.isfinite(x):
        return "-"
    return f"{100 * x:+.1f} pts" if signed else f"{100 * x:.1f} pts"


def percent(p: float | None) -> str:
    """A probability as a percentage with sensible precision ('13.4%', '0.02%', '<0.01%')."""
    if p is None or not math.isfinite(p):
        return "-"
    if p >= 0.1:
        return f"{100 * p:.1f}%"
    if p >= 1e-4:
        return f"{100 * p:.2g}%"
    return "<0.01%"


def _ci_text(ci: Interval, level: float) -> str:
    return f"{round(100 * level)}% CI [{100 * ci.lower:+.1f}, {100 * ci.upper:+.1f}] pts"


def decision_ci(est: Estimate, alpha: float) -> tuple[Interval | None, str]:
    """The two-sided (1 - 2 alpha) CI of delta: the stored 90%/95% one when the level matches, else
    recomputed with the stored method (Tango score for tango_score, else delta +- t_{df,1-alpha} SE)."""
    level = 1 - 2 * alpha
    stored = {0.90: est.ci90, 0.95: est.ci95}
    for lv, ci in stored.items():
        if math.isclose(level, lv, abs_tol=1e-9) and ci is not None:
            return ci, est.ci_method
    if est.delta is None or est.se_paired is None:
        return None, est.ci_method
    if est.se_paired == 0:
        return Interval(lower=est.delta, upper=est.delta), "degenerate"
    if est.ci_method == "tango_score" and est.mcnemar is not None and est.repeats == 1:
        from qa.stats import tango_interval

        return tango_interval(est.mcnemar.n01, est.mcnemar.n10, est.n, level), "tango_score"
    df = est.df if est.df is not None and est.df > 0 else max(est.n - 1, 1)
    half = float(sps.t.ppf(1 - alpha, df)) * est.se_paired
    method = (
        est.ci_method
        if est.ci_method in ("paired_t", "cluster_cr1_t")
        else f"paired_t (approximating {est.ci_method})"
    )
    return Interval(lower=est.delta - half, upper=est.delta + half), method


def _noninferiority(est: Estimate, tp: TaskPolicy, decides: bool) -> RuleResult:
    ci, method = decision_ci(est, tp.alpha)
    level = 1 - 2 * tp.alpha
    common = {
        "rule": "noninferiority",
        "decides": decides,
        "ci_level": level,
        "ci": ci,
        "ci_method": method,
        "margin": tp.margin,
    }
    if ci is None:
        return RuleResult(**common, status="inconclusive", detail="CI undefined (too few items)")
    if ci.lower > -tp.margin:
        detail = f"non-inferior: {_ci_text(ci, level)} lies above -{100 * tp.margin:.1f} pts"
        return RuleResult(**common, status="pass", detail=detail)
    if ci.upper < -tp.margin:
        detail = f"worse: {_ci_text(ci, level)} lies below -{100 * tp.margin:.1f} pts"
        return RuleResult(**common, status="fail", detail=detail)
    detail = f"{_ci_text(ci, level)} straddles -{100 * tp.margin:.1f} pts"
    return RuleResult(**common, status="inconclusive", detail=detail)


def _tost(est: Estimate, tp: TaskPolicy, decides: bool) -> RuleResult:
    ci, method = decision_ci(est, tp.alpha)
    level = 1 - 2 * tp.alpha
    m = tp.margin
    common = {
        "rule": "tost",
        "decides": decides,
        "ci_level": level,
        "ci": ci,
        "ci_method": method,
        "margin": m,
    }
    if ci is None:
        return RuleResult(**common, status="inconclusive", detail="CI undefined (too few items)")
    band = f"(-{100 * m:.1f}, +{100 * m:.1f}) pts"
    if -m < ci.lower and ci.upper < m:
        return RuleResult(**common, status="pass", detail=f"equivalent: {_ci_text(ci, level)} inside {band}")
    if ci.upper < -m or ci.lower > m:
        return RuleResult(
            **common, status="fail", detail=f"not equivalent: {_ci_text(ci, level)} outside {band}"
        )
    return RuleResult(
        **common, status="inconclusive", detail=f"{_ci_text(ci, level)} overlaps the edge of {band}"
    )


def _basis_se(est: Estimate, basis: str) -> float | None:
    return {"baseline": est.se_baseline, "unpaired": est.se_unpaired, "paired": est.se_paired}[basis]


def sigma_rule(est: Estimate, k: float, basis: str, decides: bool) -> RuleResult:
    """|delta| <= k * SE_basis, with its false-alarm rate 2 (1 - Phi(k SE_basis / SE_paired)) for an
    identical candidate and the drop it catches with 80% probability, k SE_basis + z_0.8 SE_paired."""
    se = _basis_se(est, basis)
    common = {"rule": "sigma", "decides": decides, "k": k, "basis": basis}
    if se is None or est.delta is None:
        return RuleResult(**common, status="inconclusive", detail=f"{basis} SE undefined (too few items)")
    threshold = k * se
    far = None
    caught = None
    if est.se_paired is not None:
        caught = threshold + Z_80 * est.se_paired
        if est.se_paired > 0:
            far = float(2 * sps.norm.sf(threshold / est.se_paired))
    ok = abs(est.delta) <= threshold
    rel = "<=" if ok else ">"
    detail = f"|delta| {100 * abs(est.delta):.1f} pts {rel} {k:g} x {basis} SE = {100 * threshold:.1f} pts"
    if far is not None:
        detail += f" (false-alarm rate {percent(far)})"
    return RuleResult(
        **common,
        status="pass" if ok else "fail",
        detail=detail,
        threshold=threshold,
        false_alarm_rate=far,
        drop_caught_80=caught,
    )


def _error_rate(errors: int, est: Estimate) -> float:
    # Errored samples are excluded from both arms, so the attempted samples are at least the
    # n * repeats paired ones plus the larger error count: a conservative (high) rate.
    attempted = est.n * max(est.repeats, 1) + max(est.n_errors_baseline, est.n_errors_candidate)
    return errors / attempted if attempted else 1.0


def select_estimate(comparison: Comparison, task: str, tp: TaskPolicy, explicit: bool) -> Estimate:
    """The estimate a task is gated on: the policy's metric, else the task's only one, else the
    first of AUTO_METRICS it has; PolicyError when the policy names a metric the task lacks."""
    ests = [e for e in comparison.estimates if e.task == task]
    have = [f"{e.metric},{e.filter}" for e in ests]
    if tp.metric is not None:
        for e in ests:
            if f"{e.metric},{e.filter}" == tp.metric:
                return e
        where = f"[tasks.{task}]" if explicit else "[default]"
        raise PolicyError(
            f"policy {where} metric {tp.metric!r} not in the comparison for {task} (has: {', '.join(have)})"
        )
    if len(ests) == 1:
        return ests[0]
    for key in AUTO_METRICS:
        if key in have:
            return ests[have.index(key)]
    raise PolicyError(
        f"task {task} has several metrics ({', '.join(have)}); set [tasks.{task}] metric = one of them"
    )


def _power(est: Estimate, tp: TaskPolicy) -> tuple[float | None, int | None]:
    z = float(sps.norm.ppf(1 - tp.alpha) + sps.norm.ppf(tp.power))
    mde = z * est.se_paired if est.se_paired is not None else None
    n_needed = None
    if est.sd_diff is not None:
        n_needed = max(1, math.ceil((z * est.sd_diff / tp.margin) ** 2))
    return mde, n_needed


def evaluate_task(est: Estimate, tp: TaskPolicy, metric_key: str) -> TaskVerdict:
    """Decide one task under its resolved policy (see the module docstring for the order)."""
    mde, n_needed = _power(est, tp)
    err_b = _error_rate(est.n_errors_baseline, est)
    err_c = _error_rate(est.n_errors_candidate, est)
    base = {
        "task": est.task,
        "metric": metric_key,
        "n": est.n,
        "delta": est.delta,
        "se_paired": est.se_paired,
        "margin": tp.margin,
        "alpha": tp.alpha,
        "mde": mde,
        "n_needed": n_needed,
        "error_rate_baseline": err_b,
        "error_rate_candidate": err_c,
    }
    # Non-inferiority and the sigma rule are always computed (reported); TOST only when asked for.
    results = [_noninferiority(est, tp, "noninferiority" in tp.rules)]
    if "tost" in tp.rules:
        results.append(_tost(est, tp, True))
    results.append(sigma_rule(est, tp.sigma_k, tp.sigma_basis, "sigma" in tp.rules))
    warnings: list[str] = []
    if est.delta is not None and est.delta > tp.margin and tp.improvement_is_warning:
        warnings.append(
            f"candidate better by {pts(est.delta)} (> margin {100 * tp.margin:.1f} pts): "
            "check the harness and that the intended model was served"
        )
    sig = results[-1]
    ni = next((r for r in results if r.rule == "noninferiority"), None)
    if ni is not None and not sig.decides and ni.status == "pass" and sig.status == "fail":
        warnings.append(
            f"the {tp.sigma_k:g}-SE rule would fail this task ({sig.detail}); non-inferiority passes"
        )
    warnings.extend(est.notes)

    worst = max(err_b, err_c)
    if worst > tp.max_error_rate:
        arm = "baseline" if err_b >= err_c else "candidate"
        reason = (
            f"too many errored samples: {arm} {100 * worst:.1f}% > max {100 * tp.max_error_rate:.1f}% "
            f"({est.n_errors_baseline} baseline, {est.n_errors_candidate} candidate errors); fix them and re-run"
        )
        return TaskVerdict(
            **base, status="inconclusive", kind="errors", reason=reason, rules=results, warnings=warnings
        )
    if not est.information:
        level = "floor" if (est.mean_baseline or 0.0) <= 0.5 else "ceiling"
        mean = "-" if est.mean_baseline is None else f"{100 * est.mean_baseline:.1f}%"
        reason = (
            f"no information: both arms at the {level} ({mean}) on "
            f"{est.n} items; accuracy cannot tell them apart, see answer agreement and KL divergence"
        )
        return TaskVerdict(
            **base,
            status="inconclusive",
            kind="no_information",
            reason=reason,
            rules=results,
            warnings=warnings,
        )
    if est.delta is None or est.se_paired is None:
        reason = f"delta or its SE undefined on {est.n} paired items"
        return TaskVerdict(
            **base, status="inconclusive", kind="undefined", reason=reason, rules=results, warnings=warnings
        )

    deciding = [r for r in results if r.decides]
    statuses = {r.status for r in deciding}
    status: Status = (
        "fail" if "fail" in statuses else "inconclusive" if "inconclusive" in statuses else "pass"
    )
    first = next(r for r in deciding if r.status == status)
    reason = first.detail
    # A CI wholly beyond the margin is decisive whatever the power: that fail stands.
    decisive_fail = any(r.status == "fail" and r.rule in ("noninferiority", "tost") for r in deciding)
    uses_margin = any(r.rule in ("noninferiority", "tost") for r in deciding)
    short_n = est.n < tp.min_n
    low_power = uses_margin and mde is not None and mde > tp.margin
    if (short_n or low_power) and not decisive_fail:
        why = (
            f"n = {est.n} < min_n {tp.min_n}"
            if short_n
            else f"MDE {100 * mde:.1f} pts > margin {100 * tp.margin:.1f} pts"
        )
        need = (
            f"; need about {n_needed} items (or more repeats)"
            if n_needed is not None and n_needed > est.n
            else ""
        )
        reason = f"underpowered: {why}{need}; {first.detail}"
        return TaskVerdict(
            **base,
            status=tp.underpowered,
            kind="underpowered",
            reason=reason,
            rules=results,
            warnings=warnings,
        )
    return TaskVerdict(**base, status=status, kind="decided", reason=reason, rules=results, warnings=warnings)


def _summary(tasks: list[TaskVerdict], status: Status) -> str:
    n = len(tasks)
    if not tasks:
        return "INCONCLUSIVE: nothing to gate (the comparison has no accuracy estimates)"
    by = {s: [t.task for t in tasks if t.status == s] for s in ("pass", "fail", "inconclusive")}
    if status == "pass":
        return f"PASS: all {n} task(s) pass"
    parts = []
    if by["fail"]:
        parts.append(f"{len(by['fail'])} failed ({', '.join(by['fail'])})")
    if by["inconclusive"]:
        parts.append(f"{len(by['inconclusive'])} inconclusive ({', '.join(by['inconclusive'])})")
    parts.append(f"{len(by['pass'])} of {n} passed")
    return f"{status.upper()}: " + "; ".join(parts)


def evaluate(comparison: Comparison, policy: Policy, comparison_sha256: str | None = None) -> Verdict:
    """Re-decide every task of `comparison` under `policy`; pass only if every task passes."""
    tasks_in = list(dict.fromkeys(e.task for e in comparison.estimates))
    verdicts: list[TaskVerdict] = []
    for task in tasks_in:
        tp = policy.for_task(task)
        est = select_estimate(comparison, task, tp, explicit=task in policy.tasks)
        verdicts.append(evaluate_task(est, tp, f"{est.metric},{est.filter}"))
    for task in policy.require:
        if task not in tasks_in:
            tp = policy.for_task(task)
            verdicts.append(
                TaskVerdict(
                    task=task,
                    metric=tp.metric or "-",
                    status="inconclusive",
                    kind="missing",
                    reason="required by the policy but absent from comparison.json; run it",
                    margin=tp.margin,
                    alpha=tp.alpha,
                )
            )
    statuses = {v.status for v in verdicts}
    status: Status = (
        "fail"
        if "fail" in statuses
        else "inconclusive"
        if ("inconclusive" in statuses or not verdicts)
        else "pass"
    )
    return Verdict(
        status=status,
        summary=_summary(verdicts, status),
        baseline=comparison.baseline,
        candidate=comparison.candidate,
        sign_convention=comparison.sign_convention,
        tasks=verdicts,
        policy=policy,
        policy_sha256=policy.sha256(),
        comparison_sha256=comparison_sha256,
    )


def gate_run(run_dir: Path, policy: Policy) -> Verdict:
    """Load `run_dir`/comparison.json, evaluate it under `policy`, write verdict.json atomically."""
    path = run_dir / "comparison.json"
    comparison = load_comparison(path)
    verdict = evaluate(comparison, policy, sha256_file(path))
    write_verdict(run_dir / "verdict.json", verdict)
    return verdict


def write_verdict(path: Path, verdict: Verdict) -> None:
    """Write verdict.json atomically."""
    atomic_write_text(path, verdict.model_dump_json(indent=2) + "\n")


def load_verdict(path: Path) -> Verdict:
    """Read verdict.json; a missing or invalid file is a one-line QAError."""
    if not path.is_file():
        raise QAError(f"{path}: no verdict.json; run `qa gate RUN_DIR` first")
    try:
        return Verdict.model_validate_json(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise QAError(
            f"{path}: invalid verdict.json ({str(exc).splitlines()[0]}); re-run `qa gate`"
        ) from None


# XML 1.0 cannot carry most control characters, even escaped; task names come from user data.
_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _xml_safe(text: str) -> str:
    return _XML_BAD.sub("\ufffd", text)


def junit_xml(verdict: Verdict) -> str:
    """JUnit XML, one testcase per task: fail -> <failure>, inconclusive -> <error type="inconclusive">
    (never a silent pass or skip in a CI dashboard)."""
    fails = sum(t.status == "fail" for t in verdict.tasks)
    incs = sum(t.status == "inconclusive" for t in verdict.tasks)
    suites = ET.Element(
        "testsuites",
        name="accuracy-parity",
        tests=str(len(verdict.tasks)),
        failures=str(fails),
        errors=str(incs),
    )
    suite = ET.SubElement(
        suites,
        "testsuite",
        name=_xml_safe(f"qa gate: {verdict.candidate} vs {verdict.baseline}"),
        tests=str(len(verdict.tasks)),
        failures=str(fails),
        errors=str(incs),
        skipped="0",
    )
    for t in verdict.tasks:
        case = ET.SubElement(suite, "testcase", classname="qa.gate", name=_xml_safe(f"{t.task} [{t.metric}]"))
        if t.status == "fail":
            el = ET.SubElement(case, "failure", type=t.kind, message=_xml_safe(t.reason))
            el.text = _xml_safe(_case_text(t))
        elif t.status == "inconclusive":
            el = ET.SubElement(case, "error", type=f"inconclusive:{t.kind}", message=_xml_safe(t.reason))
            el.text = _xml_safe(_case_text(t))
        else:
            out = ET.SubElement(case, "system-out")
            out.text = _xml_safe(_case_text(t))
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def _case_text(t: TaskVerdict) -> str:
    lines = [t.reason] + [
        f"{r.rule}{'' if r.decides else ' (reported)'}: {r.status}: {r.detail}" for r in t.rules
    ]
    return "\n".join(lines + [f"warning: {w}" for w in t.warnings])


def write_junit(path: Path, verdict: Verdict) -> None:
    """Write the JUnit XML report atomically."""
    atomic_write_text(path, junit_xml(verdict))


_STATUS_MARK = {"pass": "✅ PASS", "fail": "❌ FAIL", "inconclusive": "⚠️ INCONCLUSIVE"}


_MD_SPECIAL = re.compile(r"([\\`*|~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])|\]\(|^[#>+-]|!\[)")


def md_cell(text: str) -> str:
    """Text made safe for Markdown (a table cell or a list item): HTML-escaped, newlines folded,
    emphasis, code, link and table syntax backslash-escaped (intraword underscores left as they are)."""
    s = html.escape(re.sub(r"[\r\n]+", " ", text), quote=False)
    return _MD_SPECIAL.sub(lambda m: "\\" + m.group(0), s)


def summary_markdown(verdict: Verdict) -> str:
    """Markdown for a CI step summary: the verdict line, then one row per task."""
    lines = [
        f"## {_STATUS_MARK[verdict.status]}: {md_cell(verdict.candidate)} vs {md_cell(verdict.baseline)}",
        "",
        md_cell(verdict.summary),
        "",
        "| task | metric | status | n | delta | 90% CI | margin | reason |",
        "|---|---|---|---:|---:|---|---:|---|",
    ]
    for t in verdict.tasks:
        ni = next((r for r in t.rules if r.ci is not None), None)
        ci = (
            f"[{100 * ni.ci.lower:+.1f}, {100 * ni.ci.upper:+.1f}]"
            if ni is not None and ni.ci is not None
            else "-"
        )
        lines.append(
            f"| {md_cell(t.task)} | {md_cell(t.metric)} | {_STATUS_MARK[t.status]} | {t.n} | {pts(t.delta)} | {ci} | "
            f"{100 * t.margin:.1f} pts | {md_cell(t.reason)} |"
        )
    warns = [(t.task, w) for t in verdict.tasks for w in t.warnings]
    if warns:
        lines += ["", "**Warnings**", ""] + [f"- {md_cell(task)}: {md_cell(w)}" for task, w in warns]
    lines += [
        "",
        f"_{md_cell(verdict.sign_convention)}; policy {md_cell(verdict.policy.name)} ({verdict.policy_sha256[:12]})_",
        "",
    ]
    return "\n".join(lines)


def write_summary(path: Path, verdict: Verdict) -> None:
    """Write the step-summary Markdown atomically; an existing file (GITHUB_STEP_SUMMARY) is appended to."""
    text = summary_markdown(verdict)
    if path.exists() and path.stat().st_size > 0:
        text = path.read_text(encoding="utf-8") + "\n" + text
    atomic_write_text(path, text)
