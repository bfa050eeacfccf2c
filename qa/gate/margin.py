"""The one decision of an interval against a margin: pass, fail or inconclusive.

Every rule that reads an interval (non-inferiority, TOST, truncation, the reference-answer and cache-KL
rules, a sequential look) asks `interval_status` with its own limits. It lives in the gate, not in
qa.stats, because it is a decision: qa.stats computes numbers (the intervals themselves, from
qa.stats.intervals and qa.stats.basic.t_interval) and decides nothing.
"""

from __future__ import annotations

from qa.files.comparison import Interval
from qa.files.verdict import Status


def interval_status(ci: Interval, *, above: float | None = None, below: float | None = None) -> Status:
    """Pass iff the interval lies wholly, strictly, above `above` and below `below` (None: no such limit);
    fail iff it lies wholly on the wrong side of either (upper < above, or lower > below); else
    inconclusive (it straddles a limit, or a limit is NaN).

    Non-inferiority with higher as better is above=-margin; a change that must stay small (a truncation
    rate, a KL) is below=+margin; TOST is both, above=-margin and below=+margin."""
    if above is None and below is None:
        raise ValueError("interval_status needs a limit: above, below or both")
    if (above is None or ci.lower > above) and (below is None or ci.upper < below):
        return "pass"
    if (above is not None and ci.upper < above) or (below is not None and ci.lower > below):
        return "fail"
    return "inconclusive"
