"""The gate's decision at one sequential look, and the record of a task's looks (comparison.sequential).

At look k of a policy with `looks` (information fractions) and `spending` (qa.stats.sequential), on the
paired estimate of the items run so far: the one-sided critical z_crit(k) comes from the spending at the
actual fractions (earlier looks at their planned sizes, this look at n / n_planned, the last look at 1.0 so
that all of alpha is spent; Lan-DeMets), and the interval is the fixed-n rule's own paired interval
(qa.stats.intervals.delta_interval) at the adjusted two-sided level 1 - 2 (1 - Phi(z_crit)).

- pass: its lower limit lies above -margin (non-inferiority shown at the adjusted level; with the "tost"
  rule its upper limit also below +margin), n >= min_n, accuracy carries information and neither arm's
  error rate exceeds the budget; a policy that lets the "sigma" rule decide never passes early (that rule
  has no adjusted level);
- fail: its upper limit lies below -margin (demonstrably worse; like the fixed-n gate, at any n; with
  "tost" also a lower limit above +margin) and the error budget holds;
- else continue. At the last look the same interval decides and `qa.gate.rules` finishes the task as the
  fixed-n gate does, at the adjusted level.

Pass and fail are two one-sided tests of different nulls, each at alpha; neither boundary binds the other
(a fail stop only removes chances to pass), so each error rate stays <= alpha.
"""

from __future__ import annotations

from qa.files.comparison import Estimate, SequentialLook, SequentialTask
from qa.files.policy import TaskPolicy
from qa.gate.margin import interval_status
from qa.gate.rules import error_rate, no_information
from qa.stats.intervals import delta_interval
from qa.stats.sequential import Design, adjusted_level, boundaries_at, cumulative_alpha, look_sizes, spent

MIN_STEP = 1e-6  # smallest fraction step between looks: a look with no more items than the last one


def design_of(tp: TaskPolicy) -> Design:
    """The sequential design of a task policy (its looks must be set)."""
    if not tp.looks:
        raise ValueError("the task policy has no sequential looks (looks = [] is fixed n)")
    return Design(looks=tp.looks, alpha=tp.alpha, spending=tp.spending)


def look_times(tp: TaskPolicy, look: int, n: int, n_planned: int) -> tuple[float, ...]:
    """Information fractions of looks 0..look: earlier looks at their planned sizes / n_planned, this one
    at n / n_planned (1.0 at the last look), each above the previous one."""
    design = design_of(tp)
    if not 0 <= look < len(design.looks):
        raise ValueError(f"look {look} out of range: the policy has {len(design.looks)} looks")
    sizes = look_sizes(design, n_planned)
    times = [s / n_planned for s in sizes[:look]]
    now = 1.0 if look == len(design.looks) - 1 else min(n / n_planned, 1.0)
    prev = times[-1] if times else 0.0
    times.append(min(1.0, max(now, prev + MIN_STEP)))
    return tuple(times)


def look_decision(est: Estimate, tp: TaskPolicy, look: int, n_planned: int) -> SequentialLook:
    """Pass, fail or continue at 0-based `look` on the estimate of the items run so far (module docstring)."""
    times = look_times(tp, look, est.n, n_planned)
    bounds = boundaries_at(times, tp.alpha, tp.spending)
    z = bounds[-1]
    level = adjusted_level(z)
    if tp.spending == "confidence_sequence":
        alpha_spent = cumulative_alpha(times, bounds)[-1]  # exact H0 crossing probability at these looks
    else:
        alpha_spent = spent(tp.spending, tp.alpha, times[-1])
    ci = delta_interval(est, level)
    errors_ok = max(error_rate(est.n_errors_baseline, est), error_rate(est.n_errors_candidate, est)) <= tp.max_error_rate
    below = tp.margin if "tost" in tp.rules else None  # equivalence: the interval must also lie below +margin
    decision = "continue"
    if ci is not None and errors_ok:
        status = interval_status(ci, above=-tp.margin, below=below)
        if status == "fail":
            decision = "fail"
        elif (status == "pass" and "sigma" not in tp.rules and est.n >= tp.min_n
              and no_information(est) is None):
            decision = "pass"
    return SequentialLook(look=look, fraction=est.n / n_planned, n=est.n, z_crit=z, adjusted_level=level,
                          alpha_spent=alpha_spent, lower=ci.lower if ci else None, upper=ci.upper if ci else None,
                          decision=decision)


def sequential_task(est: Estimate, tp: TaskPolicy, looks: list[SequentialLook], n_planned: int) -> SequentialTask:
    """The record of a task's looks so far: stopped at the first pass/fail look, "final" when the last look
    was reached without one, else "continue" (more looks to run)."""
    stop = next((lk for lk in looks if lk.decision != "continue"), None)
    last = len(design_of(tp).looks) - 1
    if stop is not None and stop.look < last:
        decision, stopped_at, used = stop.decision, stop.look, stop.n
    elif looks and looks[-1].look == last:
        decision, stopped_at, used = "final", None, looks[-1].n
    else:
        decision, stopped_at, used = "continue", None, looks[-1].n if looks else 0
    return SequentialTask(task=est.task, metric=est.metric, filter=est.filter, spending=tp.spending,
                          looks=looks, n_planned=n_planned, stopped_at=stopped_at, decision=decision,
                          items_used=used, items_saved=max(0, n_planned - used))

