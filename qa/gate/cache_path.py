"""The cache-path rules of a sessions task (comparison.json `cache_path`, qa.compare.cache_path): the
candidate's warm path (served from its prefix cache), as users get it, against the baseline; and how far
each arm's warm path drifts from its own cold path.

Four rules, each a RuleResult on the task's verdict. With `gate_cache_path` (the default) they join the
task's own (cold-path) rules; which of them decide is the policy's `cache_gate`:

- "warm_path" (the default): cache_accuracy decides, the drift rules (hit rate, excess flips, KL) are
  reported beside it. The candidate's warm path is held to the bar its cold path is held to, at the
  task's margin: a warm path that drifts from its cold path within that margin is what users get and
  is no worse for it.
- "drift": all four decide. Right when the release changes only the cache path (a new prefix cache, a
  replay, a different block size on the same format): then any excess drift is the change under test.

- cache_hit_rate: the candidate's warm path must have read prompt tokens from its prefix cache. A
  measured hit rate of 0, or an engine that does not say, is "no information" (inconclusive), never a
  pass: its warm path was a cold one and says nothing about the cache.
- cache_flips: the excess-flip sign test (the candidate's warm-vs-cold flips against the baseline's);
  fail when p_excess < alpha.
- cache_kl: non-inferiority of KL(cold || warm): the (1 - 2 alpha) t interval of the candidate's KL
  minus the baseline's (CR1 by session) must lie below +cache_kl_margin; fail when wholly above it.
- cache_accuracy: the candidate's warm path against the baseline's cold path, decided by the task's
  own rules (non-inferiority at `margin`, power, no information) exactly like any task.
- cache_reference_logprob, cache_reference_kl: the reference-answer rules (qa.gate.reference, at the task's
  reference margins) on the candidate's warm path against the baseline's cold path; they decide where the
  task's reference rules would (`reference_gate`: always, or when the warm path's accuracy carries no
  information, in which case they decide instead of cache_accuracy).
"""

from __future__ import annotations

from collections.abc import Callable

from qa.files.comparison import CacheArm, CacheKLDelta, CachePathEstimate, Comparison, Estimate, ExcessFlips
from qa.files.policy import TaskPolicy
from qa.files.verdict import Kind, RuleResult, TaskVerdict
from qa.gate.margin import interval_status
from qa.gate.reference import kl_rule as reference_kl_rule
from qa.gate.reference import logprob_rule as reference_logprob_rule
from qa.gate.reference import reference_decides
from qa.stats.basic import t_interval
from qa.textfmt import ci_text, percent

DecideTask = Callable[[Estimate, TaskPolicy, str], TaskVerdict]  # qa.gate.rules.decide_task


def drift_decides(tp: TaskPolicy) -> bool:
    """Whether the warm/cold drift rules (hit rate, excess flips, KL) decide, not only report."""
    return tp.gate_cache_path and tp.cache_gate == "drift"


def _tokens(arm: CacheArm) -> str:
    if arm.hit_rate is None:
        return "not reported"
    return f"{percent(arm.hit_rate)} ({arm.cached_tokens} of {arm.prompt_tokens} prompt tokens)"


def hit_rate_rule(cp: CachePathEstimate, tp: TaskPolicy) -> RuleResult:
    """Pass iff the candidate's warm path read a non-zero share of its prompt tokens from the prefix cache."""
    c = cp.candidate
    common = {"rule": "cache_hit_rate", "decides": drift_decides(tp)}
    rates = f"warm-path hit rate: candidate {_tokens(c)}, baseline {_tokens(cp.baseline)}"
    if c.hit_rate is None:
        return RuleResult(**common, status="inconclusive",
                          detail=f"no information: the candidate's engine did not report cached prompt tokens ({rates})")
    if c.hit_rate == 0:
        return RuleResult(**common, status="inconclusive",
                          detail=f"no information: the candidate's warm path never hit its prefix cache ({rates})")
    return RuleResult(**common, status="pass", threshold=c.hit_rate, detail=rates)


def flips_rule(ex: ExcessFlips | None, tp: TaskPolicy) -> RuleResult | None:
    """Fail iff the candidate's warm-vs-cold flips exceed the baseline's (one-sided sign test p < alpha)."""
    if ex is None:
        return None
    counts = (f"{ex.flips_candidate} candidate vs {ex.flips_rerun} baseline warm-vs-cold flips of {ex.n} turns "
              f"({ex.only_candidate} only in the candidate, {ex.only_rerun} only in the baseline), "
              f"sign test p = {ex.p_excess:.3g}")
    common = {"rule": "cache_flips", "decides": drift_decides(tp)}
    if ex.p_excess < tp.alpha:
        return RuleResult(**common, status="fail", detail=f"the warm path flips more answers: {counts} < {tp.alpha:g}")
    return RuleResult(**common, status="pass", detail=f"no excess flips: {counts}")


def kl_rule(kl: CacheKLDelta | None, tp: TaskPolicy) -> RuleResult | None:
    """Pass iff the (1 - 2 alpha) CI of the KL(cold || warm) difference lies below +cache_kl_margin."""
    if kl is None:
        return None
    level, m = 1 - 2 * tp.alpha, tp.cache_kl_margin
    common = {"rule": "cache_kl", "decides": drift_decides(tp), "ci_level": level, "ci_method": "cluster_cr1_t",
              "margin": m}
    what = (f"KL(cold || warm) candidate {kl.mean_candidate:.4g} - baseline {kl.mean_baseline:.4g} = "
            f"{kl.delta:+.4g} nats/token over {kl.n} turns")
    if kl.se is None or kl.df is None:
        return RuleResult(**common, status="inconclusive", detail=f"{what}; CI undefined (fewer than 2 sessions)")
    if kl.se == 0:
        if kl.n < tp.min_n:
            return RuleResult(**common, status="inconclusive",
                              detail=f"{what}, the same on every turn; n = {kl.n} < min_n {tp.min_n} to decide on that")
        ok = kl.delta < m
        return RuleResult(**common, status="pass" if ok else "fail",
                          detail=f"{what}, the same on every one of {kl.n} turns ({'<' if ok else '>='} {m:g})")
    ci = t_interval(kl.delta, kl.se, kl.df, level)
    text = f"{what}, {100 * level:.0f}% CI [{ci.lower:+.4g}, {ci.upper:+.4g}]"
    status = interval_status(ci, below=m)
    detail = {"pass": f"non-inferior: {text} lies below +{m:g}",
              "fail": f"the warm path diverges more: {text} lies above +{m:g}",
              "inconclusive": f"{text} straddles +{m:g}"}[status]
    return RuleResult(**common, ci=ci, status=status, detail=detail)


def accuracy_rule(cp: CachePathEstimate, tp: TaskPolicy, metric_key: str,
                  decide_task: DecideTask) -> tuple[RuleResult, Kind] | None:
    """The candidate's warm path against the baseline's cold path, decided as a task is (None: no estimate)."""
    est = next((e for e in cp.accuracy if f"{e.metric},{e.filter}" == metric_key), None)
    if est is None:
        return None
    tv = decide_task(est, tp, metric_key)
    ni = next((r for r in tv.rules if r.rule == "noninferiority"), None)
    ci = f" ({ci_text(ni.ci, ni.ci_level)})" if ni is not None and ni.ci is not None and ni.ci_level else ""
    rule = RuleResult(rule="cache_accuracy", decides=tp.gate_cache_path, status=tv.status, margin=tp.margin,
                      ci_level=ni.ci_level if ni else None, ci=ni.ci if ni else None,
                      ci_method=ni.ci_method if ni else None,
                      detail=f"candidate warm path vs baseline cold path{ci}: {tv.reason}")
    return rule, tv.kind


def warm_reference_rules(cp: CachePathEstimate, tp: TaskPolicy, no_information: bool) -> list[RuleResult]:
    """The reference-answer rules on the candidate's warm path vs the baseline's cold path (none without a
    reference), deciding as the task's reference rules do (`reference_gate`) when the cache path decides."""
    ref = cp.warm_reference
    if ref is None or ref.n == 0:
        return []
    decides = tp.gate_cache_path and reference_decides(tp, no_information)
    pairs = (("cache_reference_logprob", reference_logprob_rule(ref, tp, decides)),
             ("cache_reference_kl", reference_kl_rule(ref, tp, decides)))
    return [r.model_copy(update={"rule": name, "detail": f"candidate warm path vs baseline cold path: {r.detail}"})
            for name, r in pairs]


def cache_rules(cp: CachePathEstimate, tp: TaskPolicy, metric_key: str,
                decide_task: DecideTask) -> list[tuple[RuleResult, Kind]]:
    """Every cache-path rule that applies, each with the verdict kind it gives when it decides the task."""
    out: list[tuple[RuleResult, Kind]] = []
    hit = hit_rate_rule(cp, tp)
    out.append((hit, "no_information" if hit.status == "inconclusive" else "decided"))
    for rule in (flips_rule(cp.excess_flips.get(metric_key), tp), kl_rule(cp.kld, tp)):
        if rule is not None:
            out.append((rule, "undefined" if rule.status == "inconclusive" and rule.ci is None else "decided"))
    acc = accuracy_rule(cp, tp, metric_key, decide_task)
    no_information = acc is not None and acc[1] == "no_information"
    refs = warm_reference_rules(cp, tp, no_information)
    if acc is not None:
        if no_information and any(r.decides for r in refs):  # the reference answers decide instead
            acc = (acc[0].model_copy(update={"decides": False}), acc[1])
        out.append(acc)
    out += [(r, "decided" if r.status != "inconclusive" else "undefined") for r in refs]
    return out


def _warnings(cp: CachePathEstimate, rules: list[RuleResult], tp: TaskPolicy) -> list[str]:
    out = []
    if cp.baseline.hit_rate == 0:
        out.append("the baseline's warm path never hit its prefix cache: its warm-vs-cold floor is a plain rerun")
    for arm in (cp.baseline, cp.candidate):
        if arm.cold_hit_rate:
            out.append(f"{arm.arm}'s cold path read {percent(arm.cold_hit_rate)} of its prompt tokens from the "
                       "prefix cache: the cold reset did not work")
    if cp.candidate.hit_rate == 0 and not drift_decides(tp):
        out.append("the candidate's warm path never hit its prefix cache: it was a cold path, and its gate says "
                   "nothing about the cache")
    why = "gate_cache_path = false" if not tp.gate_cache_path else "cache_gate = warm_path reports the drift"
    out += [f"the {r.rule} rule would fail this task ({r.detail}); {why}"
            for r in rules if r.status == "fail" and not r.decides]
    return out


def with_cache_path(tv: TaskVerdict, comparison: Comparison, tp: TaskPolicy, decide_task: DecideTask) -> TaskVerdict:
    """The task's verdict with its cache-path rules added (unchanged for a task without a cache path); with
    gate_cache_path they decide too: any fail fails, else any inconclusive makes it inconclusive."""
    cp = next((c for c in comparison.cache_path if c.task == tv.task), None)
    if cp is None:
        return tv
    ruled = cache_rules(cp, tp, tv.metric, decide_task)
    rules = [r for r, _ in ruled]
    update: dict[str, object] = {"rules": [*tv.rules, *rules], "warnings": [*tv.warnings, *_warnings(cp, rules, tp)]}
    deciding = [(r, k) for r, k in ruled if r.decides]
    fail = next(((r, k) for r, k in deciding if r.status == "fail"), None)
    unsure = next(((r, k) for r, k in deciding if r.status == "inconclusive"), None)
    if tv.status != "fail" and fail is not None:  # a cache-path fail stands whatever the cold path shows
        update.update(status="fail", kind=fail[1], reason=f"cache path: {fail[0].detail}")
    elif tv.status == "pass" and unsure is not None:
        update.update(status="inconclusive", kind=unsure[1], reason=f"cache path: {unsure[0].detail}")
    elif tv.status == "inconclusive" and unsure is not None:
        update["reason"] = f"{tv.reason}; cache path: {unsure[0].detail}"
    return tv.model_copy(update=update)
