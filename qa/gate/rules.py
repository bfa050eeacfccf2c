"""The accuracy rules: every task of a comparison under a policy, then the run (qa.gate.decide adds the
KV-scale provenance rule; that is the gate every caller uses).

Works from comparison.json numbers alone (schema 2: estimates, SEs, interval methods, counts), so a
new policy re-gates an old run without re-running anything, and shows only that policy's warnings.
Per task, in this order:

1. errors: either arm's share of errored samples above `max_error_rate` -> inconclusive;
2. information: fewer than 2 paired items, both arms pinned at one value, or a binary baseline at 0
   on every item (no regression is observable) -> inconclusive, "no information";
3. each rule (noninferiority, tost, sigma) decides pass / fail / inconclusive on the (1 - 2 alpha)
   interval of delta from `qa.stats.intervals.delta_interval`, placed against the margin by
   `qa.gate.margin.interval_status` (as every interval rule is); the sigma ("within k SE") rule is always
   computed and reported, deciding only when listed; the truncation rule (the candidate's truncation
   rate may not rise by more than `truncation_margin`, on the same (1 - 2 alpha) interval) is computed
   when the records hold truncation and decides unless `gate_truncation = false`; its fail stands
   even when accuracy carries no information (step 2), records without truncation never fail it;
4. power: n < min_n or MDE > margin -> underpowered (inconclusive or fail, as the policy says),
   unless a rule already showed the candidate demonstrably worse (that stays a fail);
5. reference answers (qa.gate.reference): where the records hold them, non-inferiority of the mean
   delta log-prob and mean KL (nats/token) is reported, and decides as `reference_gate` says (by
   default only a task where accuracy has no information, step 2).

Across tasks the verdict is an intersection-union test (Berger 1982): pass only if every task
passes, each at alpha, uncorrected; any fail -> fail; otherwise inconclusive. Holm's adjustment of the
"demonstrably worse" p-values is reported beside it (a guard, not the gate).
Exit codes: 0 pass, 1 fail, 3 inconclusive (2 is a usage or input error, raised elsewhere).
"""

from __future__ import annotations

from scipy import stats as sps

from qa.errors import PolicyError
from qa.files.comparison import Comparison, Estimate, GenerationEstimate, SequentialTask
from qa.files.policy import AUTO_METRICS, Policy, TaskPolicy
from qa.files.verdict import RuleResult, Status, TaskVerdict, Verdict
from qa.gate.cache_path import with_cache_path
from qa.gate.margin import interval_status
from qa.gate.reference import with_reference
from qa.stats.intervals import delta_interval, p_below
from qa.stats.multiplicity import holm
from qa.stats.power import items_needed, mde, repeats_needed
from qa.textfmt import ci_text, percent, pts

Z_80 = float(sps.norm.ppf(0.8))  # 0.8416: the z of 80% power in "drop caught with 80% probability"


def _ci_rule(est: Estimate, tp: TaskPolicy, rule: str, decides: bool) -> RuleResult:
    level = 1 - 2 * tp.alpha
    ci = delta_interval(est, level)
    m = tp.margin
    common = {"rule": rule, "decides": decides, "ci_level": level, "ci": ci, "ci_method": est.ci_method, "margin": m}
    if ci is None:
        return RuleResult(**common, status="inconclusive", detail="CI undefined (too few items)")
    text, edge, band = ci_text(ci, level), f"-{100 * m:.1f} pts", f"(-{100 * m:.1f}, +{100 * m:.1f}) pts"
    if rule == "noninferiority":
        status = interval_status(ci, above=-m)
        detail = {"pass": f"non-inferior: {text} lies above {edge}", "fail": f"worse: {text} lies below {edge}",
                  "inconclusive": f"{text} straddles {edge}"}[status]
    else:
        status = interval_status(ci, above=-m, below=m)
        detail = {"pass": f"equivalent: {text} inside {band}", "fail": f"not equivalent: {text} outside {band}",
                  "inconclusive": f"{text} overlaps the edge of {band}"}[status]
    return RuleResult(**common, status=status, detail=detail)


def noninferiority(est: Estimate, tp: TaskPolicy, decides: bool = True) -> RuleResult:
    """Pass iff the (1 - 2 alpha) CI's lower limit > -margin; fail iff its upper limit < -margin."""
    return _ci_rule(est, tp, "noninferiority", decides)


def tost(est: Estimate, tp: TaskPolicy, decides: bool = True) -> RuleResult:
    """Equivalence: pass iff the (1 - 2 alpha) CI lies inside (-margin, +margin); fail iff wholly outside."""
    return _ci_rule(est, tp, "tost", decides)


def sigma(est: Estimate, k: float, basis: str, decides: bool) -> RuleResult:
    """|delta| <= k * SE_basis, with its false-alarm rate 2 (1 - Phi(k SE_basis / SE_paired)) for an
    identical candidate and the drop it catches with 80% probability, k SE_basis + z_0.8 SE_paired."""
    se = {"baseline": est.se_baseline, "unpaired": est.se_unpaired, "paired": est.se_paired}[basis]
    common = {"rule": "sigma", "decides": decides, "k": k, "basis": basis}
    if se is None or est.delta is None:
        return RuleResult(**common, status="inconclusive", detail=f"{basis} SE undefined (too few items)")
    threshold = k * se
    far = caught = None
    if est.se_paired is not None:
        caught = threshold + Z_80 * est.se_paired
        if est.se_paired > 0:
            far = float(2 * sps.norm.sf(threshold / est.se_paired))
    ok = abs(est.delta) <= threshold
    detail = f"|delta| {100 * abs(est.delta):.1f} pts {'<=' if ok else '>'} {k:g} x {basis} SE = {100 * threshold:.1f} pts"
    if far is not None:
        detail += f" (false-alarm rate {percent(far)})"
    return RuleResult(**common, status="pass" if ok else "fail", detail=detail, threshold=threshold,
                      false_alarm_rate=far, drop_caught_80=caught)


def truncation(gen: GenerationEstimate | None, tp: TaskPolicy) -> RuleResult | None:
    """The candidate may not run out of budget more often: pass iff the (1 - 2 alpha) CI of the paired
    change in truncation rate (candidate - baseline) lies below +truncation_margin, fail iff wholly
    above it; neither arm truncating is a pass ("no truncation"). None when truncation is not recorded."""
    est = gen.truncation if gen is not None else None
    if gen is None or est is None or est.n == 0:
        return None
    level, m = 1 - 2 * tp.alpha, tp.truncation_margin
    common = {"rule": "truncation", "decides": tp.gate_truncation, "ci_level": level, "ci_method": est.ci_method,
              "margin": m}
    b, c = gen.baseline, gen.candidate
    counts = f"truncated {b.truncated} -> {c.truncated} of {c.n_samples} samples"
    if b.truncated == 0 and c.truncated == 0:
        return RuleResult(**common, status="pass", detail=f"no truncation: neither arm reached max_tokens ({counts})")
    ci = delta_interval(est, level)
    if ci is None:
        return RuleResult(**common, status="inconclusive", detail=f"{counts}; CI undefined (too few items)")
    text = f"change in truncation rate {pts(est.delta)}, {ci_text(ci, level)}"
    status = interval_status(ci, below=m)
    edge = f"+{100 * m:.1f} pts ({counts})"
    detail = {"pass": f"{text} lies below {edge}", "fail": f"candidate truncates more: {text} lies above {edge}",
              "inconclusive": f"{text} straddles {edge}"}[status]
    return RuleResult(**common, ci=ci, status=status, detail=detail)


def no_information(est: Estimate) -> str | None:
    """Why accuracy cannot compare the arms on this task, or None when it can."""
    if est.n < 2:
        return f"no information: only {est.n} paired item{'' if est.n == 1 else 's'} (an SE needs two)"
    mean_a, mean_b = est.mean_baseline or 0.0, est.mean_candidate or 0.0
    if est.sd_baseline == 0 and est.sd_candidate == 0 and mean_a == mean_b:
        where = (f" at the {'floor' if mean_a == 0 else 'ceiling'}" if est.binary and mean_a in (0.0, 1.0) else "")
        return (f"no information: both arms score {100 * mean_a:.1f}%{where} on every one of {est.n} items; "
                "accuracy cannot tell them apart, see answer agreement and KL divergence")
    if est.binary and est.sd_baseline == 0 and mean_a == 0.0:
        return (f"no information: the baseline scores 0 on every one of {est.n} items (candidate "
                f"{100 * mean_b:.1f}%), so no regression is observable; see answer agreement")
    return None


def error_rate(errors: int, est: Estimate) -> float:
    """Errored share of the attempted samples: errors are excluded from both arms, so the attempted
    samples are at least the n * repeats paired ones plus the larger error count (a high estimate)."""
    attempted = est.n * max(est.repeats, 1) + max(est.n_errors_baseline, est.n_errors_candidate)
    return errors / attempted if attempted else 1.0


def select_estimate(comparison: Comparison, task: str, tp: TaskPolicy, explicit: bool) -> Estimate:
    """The estimate a task is gated on: the policy's metric, else the task's only one, else the
    first of AUTO_METRICS it has; PolicyError when the policy names a metric the task lacks."""
    ests = [e for e in comparison.estimates if e.task == task]
    have = [f"{e.metric},{e.filter}" for e in ests]
    if tp.metric is not None:
        if tp.metric in have:
            return _higher_is_better(ests[have.index(tp.metric)], have)
        where = f"[tasks.{task}]" if explicit else "[default]"
        raise PolicyError(f"policy {where} metric {tp.metric!r} not in the comparison for {task} (has: {', '.join(have)})")
    if len(ests) == 1:
        return _higher_is_better(ests[0], have)
    for key in AUTO_METRICS:
        if key in have:
            return ests[have.index(key)]
    raise PolicyError(f"task {task} has several metrics ({', '.join(have)}); set [tasks.{task}] metric = one of them")


def _higher_is_better(est: Estimate, have: list[str]) -> Estimate:
    """`est`, or PolicyError when its metric is lower-is-better (Estimate.higher_is_better): the rules read
    delta = candidate - baseline with higher as better (a margin below zero), so they would pass a worse one."""
    if est.higher_is_better:
        return est
    others = [k for k in have if k != f"{est.metric},{est.filter}"]
    hint = f"gate one of {', '.join(others)}" if others else "gate another task's metric"
    raise PolicyError(f"task {est.task}: {est.metric},{est.filter} is lower-is-better and the gate's margins read "
                      f"higher as better; {hint} (its change stays in comparison.json)")


def _power(est: Estimate, tp: TaskPolicy) -> tuple[float | None, int | None, int | None]:
    """(MDE, items needed, repeats needed) at the policy's alpha, power and margin."""
    shift = est.delta if est.sd_diff == 0 and est.delta is not None else 0.0
    n_needed = None
    if est.sd_diff is not None:
        n_needed = items_needed(est.sd_diff, tp.margin, tp.alpha, tp.power, delta=shift, score_range=est.score_range)
    reps = None
    if est.sd_within is not None and est.sd_diff is not None and est.n_clusters == est.n and est.n > 0:
        reps = repeats_needed(est.sd_diff, est.sd_within, est.repeats, est.n, tp.margin, tp.alpha, tp.power)
    return mde(est, tp.alpha, tp.power), n_needed, reps


def _warnings(est: Estimate, tp: TaskPolicy, results: list[RuleResult]) -> list[str]:
    out: list[str] = []
    if est.delta is not None and est.delta > tp.margin and tp.improvement_is_warning:
        out.append(f"candidate better by {pts(est.delta)} (> margin {100 * tp.margin:.1f} pts): "
                   "check the harness and that the intended model was served")
    ni = next(r for r in results if r.rule == "noninferiority")
    sig = next(r for r in results if r.rule == "sigma")
    if not sig.decides and ni.status == "pass" and sig.status == "fail":
        out.append(f"the {tp.sigma_k:g}-SE rule would fail this task ({sig.detail}); non-inferiority passes")
    trunc = next((r for r in results if r.rule == "truncation"), None)
    if trunc is not None and not trunc.decides and trunc.status == "fail":
        out.append(f"the truncation rule would fail this task ({trunc.detail}); gate_truncation = false")
    return out + list(est.notes)


def sequential_reason(seq: SequentialTask, tp: TaskPolicy) -> str:
    """One line: the look a sequential task stopped at (or the last one run), its adjusted interval, and
    the items it did not run."""
    lk = next((x for x in seq.looks if x.look == seq.stopped_at), seq.looks[-1])
    ci = (f"{100 * lk.adjusted_level:.2f}% CI [{100 * lk.lower:+.1f}, {100 * lk.upper:+.1f}] pts"
          if lk.lower is not None and lk.upper is not None else "CI undefined")
    of = f" of {len(tp.looks)}" if tp.looks else ""
    where = (f"sequential ({seq.spending}) look {lk.look + 1}{of}, n = {lk.n} of {seq.n_planned}, "
             f"z_crit {lk.z_crit:.3f}")
    m = f"-{100 * tp.margin:.1f} pts"
    saved = f"; stopped early, {seq.items_saved} of {seq.n_planned} items not run"
    if seq.decision == "pass":
        return f"{where}: non-inferior: {ci} lies above {m}{saved}"
    if seq.decision == "fail":
        return f"{where}: worse: {ci} lies below {m}{saved}"
    if seq.decision == "final":
        return f"{where} (the last look, level {100 * lk.adjusted_level:.2f}%)"
    return f"{where}: no decision ({ci} straddles {m}) and the run ended before the last look; resume it"


def decide_task(est: Estimate, tp: TaskPolicy, metric_key: str, generation: GenerationEstimate | None = None,
                sequential: SequentialTask | None = None) -> TaskVerdict:
    """Decide one task under its resolved policy (see the module docstring for the order); a task run with
    sequential looks is decided by its recorded looks, at the adjusted level of its last look."""
    seq = sequential if sequential is not None and f"{sequential.metric},{sequential.filter}" == metric_key else None
    if seq is not None and seq.looks:
        tp = tp.model_copy(update={"alpha": float(sps.norm.sf(seq.looks[-1].z_crit))})  # adjusted one-sided level
        if seq.decision == "final":  # ran every look: the fixed-n gate decides, at the adjusted level
            v = decide_task(est, tp, metric_key, generation)
            return v.model_copy(update={"reason": f"{sequential_reason(seq, tp)}: {v.reason}"})
    mde_, n_needed, reps = _power(est, tp)
    err_b, err_c = error_rate(est.n_errors_baseline, est), error_rate(est.n_errors_candidate, est)
    results = [noninferiority(est, tp, "noninferiority" in tp.rules)]
    if "tost" in tp.rules:
        results.append(tost(est, tp))
    results.append(sigma(est, tp.sigma_k, tp.sigma_basis, "sigma" in tp.rules))
    trunc = truncation(generation, tp)
    if trunc is not None:
        results.append(trunc)
    base = {"task": est.task, "metric": metric_key, "n": est.n, "delta": est.delta, "se_paired": est.se_paired,
                "margin": tp.margin, "alpha": tp.alpha, "mde": mde_, "n_needed": n_needed, "repeats_needed": reps,
                "p_worse": p_below(est, -tp.margin), "error_rate_baseline": err_b, "error_rate_candidate": err_c,
                "rules": results, "warnings": _warnings(est, tp, results)}
    worst = max(err_b, err_c)
    if worst > tp.max_error_rate:
        arm = "baseline" if err_b >= err_c else "candidate"
        reason = (f"too many errored samples: {arm} {100 * worst:.1f}% > max {100 * tp.max_error_rate:.1f}% "
                  f"({est.n_errors_baseline} baseline, {est.n_errors_candidate} candidate errors); fix them and re-run")
        return TaskVerdict(**base, status="inconclusive", kind="errors", reason=reason)
    if trunc is not None and trunc.decides and trunc.status == "fail":  # decisive whatever accuracy shows
        return TaskVerdict(**base, status="fail", kind="decided", reason=trunc.detail)
    if seq is not None and seq.looks:  # stopped early at a pass/fail look, or the run ended before the last look
        seq_status: Status = "pass" if seq.decision == "pass" else "fail" if seq.decision == "fail" else "inconclusive"
        return TaskVerdict(**base, status=seq_status, kind="undefined" if seq_status == "inconclusive" else "decided",
                           reason=sequential_reason(seq, tp))
    why_not = no_information(est)
    if why_not is not None:
        return TaskVerdict(**base, status="inconclusive", kind="no_information", reason=why_not)
    if est.delta is None or est.se_paired is None:
        return TaskVerdict(**base, status="inconclusive", kind="undefined",
                           reason=f"delta or its SE undefined on {est.n} paired items")
    deciding = [r for r in results if r.decides]
    statuses = {r.status for r in deciding}
    status: Status = "fail" if "fail" in statuses else "inconclusive" if "inconclusive" in statuses else "pass"
    first = next(r for r in deciding if r.status == status)
    # A CI wholly beyond the margin is decisive whatever the power: that fail stands.
    decisive_fail = any(r.status == "fail" and r.rule in ("noninferiority", "tost") for r in deciding)
    uses_margin = any(r.rule in ("noninferiority", "tost") for r in deciding)
    short_n = est.n < tp.min_n
    low_power = uses_margin and mde_ is not None and mde_ > tp.margin
    if (short_n or low_power) and not decisive_fail:
        why = (f"n = {est.n} < min_n {tp.min_n}" if short_n
               else f"MDE {100 * mde_:.1f} pts > margin {100 * tp.margin:.1f} pts")  # type: ignore[operator]
        need = (f"; need about {n_needed} items (or more repeats)"
                if n_needed is not None and n_needed > est.n else "")
        return TaskVerdict(**base, status=tp.underpowered, kind="underpowered",
                           reason=f"underpowered: {why}{need}; {first.detail}")
    return TaskVerdict(**base, status=status, kind="decided", reason=first.detail)


def summary_line(tasks: list[TaskVerdict], status: Status) -> str:
    """'PASS: all 3 task(s) pass' / 'FAIL: 1 failed (gsm8k); 2 of 3 passed' ..."""
    if not tasks:
        return "INCONCLUSIVE: nothing to gate (the comparison has no accuracy estimates)"
    if status == "pass":
        return f"PASS: all {len(tasks)} task(s) pass"
    by = {s: [t.task for t in tasks if t.status == s] for s in ("pass", "fail", "inconclusive")}
    parts = [f"{len(by[s])} {word} ({', '.join(by[s])})" for s, word in (("fail", "failed"), ("inconclusive", "inconclusive"))
             if by[s]]
    return f"{status.upper()}: " + "; ".join([*parts, f"{len(by['pass'])} of {len(tasks)} passed"])


def _with_holm(verdicts: list[TaskVerdict]) -> list[TaskVerdict]:
    use = [i for i, v in enumerate(verdicts) if v.p_worse is not None and v.kind not in ("no_information", "missing")]
    if not use:
        return verdicts
    adjusted = holm([verdicts[i].p_worse for i in use])  # type: ignore[misc]
    out = list(verdicts)
    for i, p in zip(use, adjusted, strict=True):
        out[i] = out[i].model_copy(update={"p_worse_holm": float(p)})
    return out


def apply_rules(comparison: Comparison, policy: Policy, comparison_sha256: str | None = None) -> Verdict:
    """Every rule of this module on every task of `comparison` under `policy`; pass only if every task passes.
    The gate (qa.gate.decide) adds the KV-scale provenance rule."""
    tasks_in = list(dict.fromkeys(e.task for e in comparison.estimates))
    verdicts: list[TaskVerdict] = []
    for task in tasks_in:
        tp = policy.for_task(task)
        est = select_estimate(comparison, task, tp, explicit=task in policy.tasks)
        seq = next((s for s in comparison.sequential if s.task == task), None)
        verdicts.append(decide_task(est, tp, f"{est.metric},{est.filter}", comparison.generation_for(task), seq))
    verdicts = [with_reference(v, comparison, policy.for_task(v.task)) for v in verdicts]  # reference answers
    # last: a warm path with no measured hit stays inconclusive whatever decided the cold path
    verdicts = [with_cache_path(v, comparison, policy.for_task(v.task), decide_task) for v in verdicts]
    for task in policy.require:
        if task not in tasks_in:
            tp = policy.for_task(task)
            verdicts.append(TaskVerdict(task=task, metric=tp.metric or "-", status="inconclusive", kind="missing",
                                        reason="required by the policy but absent from comparison.json; run it",
                                        margin=tp.margin, alpha=tp.alpha))
    statuses = {v.status for v in verdicts}
    status: Status = ("fail" if "fail" in statuses
                      else "inconclusive" if ("inconclusive" in statuses or not verdicts) else "pass")
    return Verdict(status=status, summary=summary_line(verdicts, status), baseline=comparison.baseline,
                   candidate=comparison.candidate, sign_convention=comparison.sign_convention,
                   tasks=_with_holm(verdicts), policy=policy, policy_sha256=policy.sha256(),
                   comparison_sha256=comparison_sha256)
